"""Kubernetes: which pod and container a process runs in, for the `namespace`, `pod` and `container`
labels of its metrics (from /proc/PID/cgroup and the kubelet's pod-resources API)."""
