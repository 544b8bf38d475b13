"""A process that registers a socket like an agent but misbehaves: for the monitor's fault tests.

    python fakeagent.py RUNDIR READY MODE [FILE]     MODE: garbage | hang | not-snapshot | file

`file` answers every request with the bytes of FILE (any document a test wants an agent to send).
"""

import os
import socket
import sys
import time

rundir, ready, mode = sys.argv[1], sys.argv[2], sys.argv[3]
path = os.path.join(rundir, f"agent-{os.getpid()}.sock")
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(path)
os.chmod(path, 0o600)
listener.listen(16)
open(ready, "w").write(str(os.getpid()))
deadline = time.time() + 120
held = []
while time.time() < deadline:
    listener.settimeout(max(0.1, deadline - time.time()))
    try:
        connection, _ = listener.accept()
    except TimeoutError:
        break
    connection.recv(4096)
    if mode == "garbage":
        connection.sendall(b"\x00\x01 this is not json at all\n")
        connection.close()
    elif mode == "file":
        try:
            connection.sendall(open(sys.argv[4], "rb").read())
        except OSError:  # the client gave up (an answer over its size bound)
            pass
        connection.close()
    elif mode == "not-snapshot":
        connection.sendall(b'{"hello": "world"}\n')
        connection.close()
    else:  # hang mid-reply: half a document, then nothing
        connection.sendall(b'{"schema": "tpu-tools/agent/v1", "pid": ')
        held.append(connection)
