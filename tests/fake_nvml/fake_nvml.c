/* A stand-in for NVIDIA's libnvidia-ml.so.1 at the hardware boundary, for tests.
 *
 * The real nvidia-ml-py bindings load it (LD_LIBRARY_PATH) and call it as they call the driver's library.
 * It serves two H100 80GB HBM3 GPUs with the figures observed on a real one (reference/observed-h100):
 * GPU 0 as it was busy (a JAX job), GPU 1 as it was idle, plus NVLink on GPU 1 (an SXM board).
 * Faults are switched by environment variables, read on every call:
 *   FAKE_NVML_INIT=<code>       nvmlInitWithFlags returns this NVML error (9: driver not loaded); "hang": it
 *                               blocks forever
 *   FAKE_NVML_COUNT=<n>         number of GPUs (default 2, at most 8: an HGX board)
 *   FAKE_NVML_FAIL=fn=code,...  the named entry points return that error (3: not supported, 13: function
 *                               not found, as an older driver answers)
 *   FAKE_NVML_LOST=<index>      every query of that GPU answers GPU_IS_LOST (15)
 *   FAKE_NVML_HANG=<index>      every query of that GPU blocks forever (a fallen GPU)
 *   FAKE_NVML_SICK=<index>      that GPU has uncorrected ECC errors, remapped rows pending a reset, and runs
 *                               hot (92 C) with the hardware thermal slowdown active
 *   FAKE_NVML_PROCS=i:pid:bytes;...  compute processes (default "0:425:64409829376", GPU 0's busy job); pid 0
 *                               is the process that calls the library (a job reading NVML itself)
 *   FAKE_NVML_ENERGY_MW=<mW>    every GPU's energy counter grows at this power from the first read of it
 *   FAKE_NVML_BUSIDS=a,b,...    PCI bus ids (default 00000000:18:00.0,00000000:38:00.0, as tests/sysroot.py)
 *   FAKE_NVML_PCIE_WIDTH=i:n    GPU i's PCIe link runs at n lanes (of 16): a degraded link
 *   FAKE_NVML_REPLAYS=i:n       GPU i's PCIe replay counter (default 0)
 *   FAKE_NVML_NVLINK_DOWN=i:l   link l of GPU i is down
 *   FAKE_NVML_XID=i:code,...    XID events, each delivered once to the event set, in order
 *   FAKE_NVML_XID_STORM=rate    XID 13 events on GPU 0 without end, `rate` a second
 *   FAKE_NVML_MIG=i:n           GPU i is in MIG mode with n instances (at most 7), 10 GiB each
 *   FAKE_NVML_MIG_FLAP=1        with FAKE_NVML_MIG: every other look at the instances finds none (they are
 *                               being destroyed and made again between two reads)
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
#define OK 0
#define ERR_INVALID_ARGUMENT 2
#define ERR_NOT_SUPPORTED 3
#define ERR_NOT_FOUND 6
#define ERR_INSUFFICIENT_SIZE 7
#define ERR_GPU_IS_LOST 15
#define ERR_TIMEOUT 10

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; }
    nvmlProcessInfo_t;
typedef struct { unsigned int pid; unsigned long long timeStamp; unsigned int smUtil, memUtil, encUtil, decUtil; }
    nvmlProcessUtilizationSample_t;
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned int valueType;
    nvmlReturn_t nvmlReturn;
    union { double d; unsigned int ui; unsigned long ul; unsigned long long ull; long long sll; int si; } value;
} nvmlFieldValue_t;

typedef struct {
    int index;
    unsigned long long mem_used_v2, mem_used_v1, mem_free;
    unsigned int util_gpu, util_mem, temp, power_mw, sm_mhz;
    unsigned long long energy_mj;
    unsigned long long throttle;
    unsigned int pcie_tx, pcie_rx;
    int nvlinks;
} gpu_t;

static const unsigned long long TOTAL = 85520809984ULL, RESERVED = 503316480ULL;
static gpu_t GPUS[8] = {
    {0, 64419069952ULL, 64922386432ULL, 20598423552ULL, 83, 32, 57, 471191, 1965, 9423690ULL, 4, 9378, 20446, 0},
    {1, 0ULL, 503316480ULL, 85017493504ULL, 0, 0, 41, 70951, 345, 2474004ULL, 1, 1482, 583, 18},
    {2, 0ULL, 503316480ULL, 85017493504ULL, 0, 0, 40, 70000, 345, 2000000ULL, 1, 1000, 500, 0},
    {3, 0ULL, 503316480ULL, 85017493504ULL, 0, 0, 40, 70000, 345, 2000000ULL, 1, 1000, 500, 0},
    {4, 0ULL, 503316480ULL, 85017493504ULL, 0, 0, 40, 70000, 345, 2000000ULL, 1, 1000, 500, 0},
    {5, 0ULL, 503316480ULL, 85017493504ULL, 0, 0, 40, 70000, 345, 2000000ULL, 1, 1000, 500, 0},
    {6, 0ULL, 503316480ULL, 85017493504ULL, 0, 0, 40, 70000, 345, 2000000ULL, 1, 1000, 500, 0},
    {7, 0ULL, 503316480ULL, 85017493504ULL, 0, 0, 40, 70000, 345, 2000000ULL, 1, 1000, 500, 0},
};
#define MAX_GPUS ((int)(sizeof GPUS / sizeof GPUS[0]))

static int env_int(const char *name, int fallback) {
    const char *value = getenv(name);
    return value && *value ? atoi(value) : fallback;
}

static int pair_value(const char *name, int index, int fallback);

static int count(void) {
    int n = env_int("FAKE_NVML_COUNT", 2);
    return n < 0 ? 0 : (n > MAX_GPUS ? MAX_GPUS : n);
}

/* The error FAKE_NVML_FAIL assigns to this entry point, else 0. */
static nvmlReturn_t fault(const char *fn) {
    const char *spec = getenv("FAKE_NVML_FAIL");
    size_t len = strlen(fn);
    while (spec && *spec) {
        if (strncmp(spec, fn, len) == 0 && spec[len] == '=') return atoi(spec + len + 1);
        spec = strchr(spec, ',');
        if (spec) spec++;
    }
    return OK;
}

/* Checks every device query goes through: a bad handle, the faults of this GPU and of this entry point. */
static nvmlReturn_t check(const char *fn, const gpu_t *gpu) {
    if (gpu == NULL || gpu < GPUS || gpu >= GPUS + count()) return ERR_INVALID_ARGUMENT;
    if (env_int("FAKE_NVML_HANG", -1) == gpu->index) {
        for (;;) pause();
    }
    if (env_int("FAKE_NVML_LOST", -1) == gpu->index) return ERR_GPU_IS_LOST;
    return fault(fn);
}
#define CHECK(gpu) do { nvmlReturn_t r_ = check(__func__, (const gpu_t *)(gpu)); if (r_) return r_; } while (0)

static void copy(char *out, unsigned int size, const char *text) {
    if (size == 0) return;
    strncpy(out, text, size - 1);
    out[size - 1] = '\0';
}

static void bus_id(int index, char *out, size_t size) {
    const char *spec = getenv("FAKE_NVML_BUSIDS");
    if (!spec || !*spec) spec = "00000000:18:00.0,00000000:38:00.0,00000000:58:00.0,00000000:78:00.0";
    for (int i = 0; i < index && spec; i++) {
        spec = strchr(spec, ',');
        if (spec) spec++;
    }
    if (!spec) { snprintf(out, size, "00000000:%02x:00.0", 0x18 + index * 0x20); return; }
    size_t n = strcspn(spec, ",");
    if (n >= size) n = size - 1;
    memcpy(out, spec, n);
    out[n] = '\0';
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    const char *init = getenv("FAKE_NVML_INIT");
    (void)flags;
    if (init && strcmp(init, "hang") == 0) {
        for (;;) pause();
    }
    return env_int("FAKE_NVML_INIT", OK);
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) { return OK; }

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 13: return "Function Not Found";
    case 15: return "GPU is lost";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    nvmlReturn_t r = fault(__func__);
    if (r) return r;
    copy(version, length, "580.159.04");
    return OK;
}
nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    nvmlReturn_t r = fault(__func__);
    if (r) return r;
    copy(version, length, "13.580.159.04");
    return OK;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    nvmlReturn_t r = fault(__func__);
    if (r) return r;
    *version = 13000;
    return OK;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) { return nvmlSystemGetCudaDriverVersion(version); }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
    nvmlReturn_t r = fault(__func__);
    if (r) return r;
    *n = (unsigned int)count();
    return OK;
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return nvmlDeviceGetCount_v2(n); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, gpu_t **device) {
    nvmlReturn_t r = fault(__func__);
    if (r) return r;
    if ((int)index >= count()) return ERR_INVALID_ARGUMENT;
    *device = &GPUS[index];
    return OK;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, gpu_t **device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetIndex(gpu_t *gpu, unsigned int *index) { CHECK(gpu); *index = gpu->index; return OK; }
nvmlReturn_t nvmlDeviceGetMinorNumber(gpu_t *gpu, unsigned int *minor) { CHECK(gpu); *minor = gpu->index; return OK; }
nvmlReturn_t nvmlDeviceGetName(gpu_t *gpu, char *name, unsigned int length) {
    CHECK(gpu);
    copy(name, length, "NVIDIA H100 80GB HBM3");
    return OK;
}
nvmlReturn_t nvmlDeviceGetUUID(gpu_t *gpu, char *uuid, unsigned int length) {
    char text[64];
    CHECK(gpu);
    snprintf(text, sizeof text, "GPU-00000000-0000-0000-0000-00000000000%d", gpu->index);
    copy(uuid, length, text);
    return OK;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(gpu_t *gpu, nvmlPciInfo_t *pci) {
    CHECK(gpu);
    memset(pci, 0, sizeof *pci);
    bus_id(gpu->index, pci->busId, sizeof pci->busId);
    unsigned int domain = 0, bus = 0, device = 0;
    sscanf(pci->busId, "%x:%x:%x", &domain, &bus, &device);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = device;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04x:%02x:%02x.0", domain & 0xffff, bus, device);
    pci->pciDeviceId = 0x233010de;
    pci->pciSubSystemId = 0x16c110de;
    return OK;
}
/* MIG devices: their own handles, outside GPUS. */
typedef struct { int gpu, slot; } mig_t;
static mig_t MIGS[8][7];
static int mig_looks;

static int mig_count(int index) {
    int n = pair_value("FAKE_NVML_MIG", index, 0);
    return n < 0 ? 0 : (n > 7 ? 7 : n);
}
static const mig_t *as_mig(const void *handle) {
    const mig_t *mig = (const mig_t *)handle;
    if (mig < &MIGS[0][0] || mig >= &MIGS[0][0] + 8 * 7) return NULL;
    return mig;
}
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(gpu_t *gpu, unsigned int *n) { CHECK(gpu); *n = 7; return OK; }
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(gpu_t *gpu, unsigned int index, mig_t **handle) {
    CHECK(gpu);
    int flapping = env_int("FAKE_NVML_MIG_FLAP", 0) && (mig_looks++ % 2);
    if (flapping || (int)index >= mig_count(gpu->index)) return ERR_NOT_FOUND;
    MIGS[gpu->index][index].gpu = gpu->index;
    MIGS[gpu->index][index].slot = (int)index;
    *handle = &MIGS[gpu->index][index];
    return OK;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceId(const void *handle, unsigned int *id) {
    const mig_t *mig = as_mig(handle);
    if (!mig) return ERR_INVALID_ARGUMENT;
    *id = 1 + (unsigned int)mig->slot;
    return OK;
}
nvmlReturn_t nvmlDeviceGetComputeInstanceId(const void *handle, unsigned int *id) {
    if (!as_mig(handle)) return ERR_INVALID_ARGUMENT;
    *id = 0;
    return OK;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(gpu_t *gpu, nvmlMemory_t *memory) {
    const mig_t *mig = as_mig(gpu);
    if (mig) {
        memory->total = 10737418240ULL;
        memory->used = (unsigned long long)(mig->slot + 1) << 30;
        memory->free = memory->total - memory->used;
        return OK;
    }
    CHECK(gpu);
    memory->total = TOTAL;
    memory->used = gpu->mem_used_v1;
    memory->free = gpu->mem_free;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(gpu_t *gpu, nvmlMemory_v2_t *memory) {
    CHECK(gpu);
    if (memory->version != 0x02000028) return 25; /* argument version mismatch */
    memory->total = TOTAL;
    memory->reserved = RESERVED;
    memory->used = gpu->mem_used_v2;
    memory->free = gpu->mem_free;
    return OK;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(gpu_t *gpu, nvmlUtilization_t *util) {
    CHECK(gpu);
    util->gpu = gpu->util_gpu;
    util->memory = gpu->util_mem;
    return OK;
}
static int sick(const gpu_t *gpu) { return env_int("FAKE_NVML_SICK", -1) == gpu->index; }

nvmlReturn_t nvmlDeviceGetTemperature(gpu_t *gpu, int sensor, unsigned int *temp) {
    CHECK(gpu);
    if (sensor != 0) return ERR_NOT_SUPPORTED;
    *temp = sick(gpu) ? 92 : gpu->temp;
    return OK;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(gpu_t *gpu, unsigned int *mw) { CHECK(gpu); *mw = gpu->power_mw; return OK; }
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(gpu_t *gpu, unsigned int *mw) { CHECK(gpu); *mw = 700000; return OK; }
nvmlReturn_t nvmlDeviceGetPowerManagementLimit(gpu_t *gpu, unsigned int *mw) { CHECK(gpu); *mw = 700000; return OK; }
static double energy_since = -1.0; /* FAKE_NVML_ENERGY_MW: when the counters were first read */
static double now_s(void);
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(gpu_t *gpu, unsigned long long *mj) {
    CHECK(gpu);
    int mw = env_int("FAKE_NVML_ENERGY_MW", 0);
    if (energy_since < 0) energy_since = now_s();
    *mj = gpu->energy_mj + (unsigned long long)(mw * (now_s() - energy_since));
    return OK;
}
nvmlReturn_t nvmlDeviceGetClockInfo(gpu_t *gpu, int type, unsigned int *mhz) {
    CHECK(gpu);
    if (type == 2) *mhz = 2619; /* memory */
    else *mhz = gpu->sm_mhz; /* graphics, SM */
    return OK;
}
nvmlReturn_t nvmlDeviceGetMaxClockInfo(gpu_t *gpu, int type, unsigned int *mhz) {
    CHECK(gpu);
    *mhz = type == 2 ? 2619 : 1980;
    return OK;
}
nvmlReturn_t nvmlDeviceGetPerformanceState(gpu_t *gpu, int *pstate) { CHECK(gpu); *pstate = 0; return OK; }
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(gpu_t *gpu, unsigned long long *reasons) {
    CHECK(gpu);
    *reasons = sick(gpu) ? (gpu->throttle | 0x40) : gpu->throttle;
    return OK;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(gpu_t *gpu, unsigned long long *reasons) {
    CHECK(gpu);
    *reasons = sick(gpu) ? (gpu->throttle | 0x40) : gpu->throttle;
    return OK;
}
nvmlReturn_t nvmlDeviceGetEccMode(gpu_t *gpu, int *current, int *pending) {
    CHECK(gpu);
    *current = 1;
    *pending = 1;
    return OK;
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(gpu_t *gpu, int error_type, int counter_type, unsigned long long *n) {
    CHECK(gpu);
    (void)error_type;
    *n = sick(gpu) ? (counter_type == 0 ? 2 : 5) : 0;
    return OK;
}
nvmlReturn_t nvmlDeviceGetRemappedRows(gpu_t *gpu, unsigned int *corr, unsigned int *unc, unsigned int *pending,
                                       unsigned int *failure) {
    CHECK(gpu);
    *corr = *unc = *pending = *failure = 0;
    if (sick(gpu)) {
        *unc = 3;
        *pending = 1;
    }
    return OK;
}
nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(gpu_t *gpu, unsigned int *v) { CHECK(gpu); *v = 5; return OK; }
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(gpu_t *gpu, unsigned int *v) {
    CHECK(gpu);
    *v = (unsigned int)pair_value("FAKE_NVML_PCIE_WIDTH", gpu->index, 16);
    return OK;
}
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(gpu_t *gpu, unsigned int *v) { CHECK(gpu); *v = 5; return OK; }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(gpu_t *gpu, unsigned int *v) { CHECK(gpu); *v = 16; return OK; }
nvmlReturn_t nvmlDeviceGetPcieThroughput(gpu_t *gpu, int counter, unsigned int *kbps) {
    CHECK(gpu);
    *kbps = counter == 0 ? gpu->pcie_tx : gpu->pcie_rx;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMigMode(gpu_t *gpu, unsigned int *current, unsigned int *pending) {
    CHECK(gpu);
    *current = *pending = mig_count(gpu->index) > 0;
    return OK;
}
nvmlReturn_t nvmlDeviceGetPersistenceMode(gpu_t *gpu, int *mode) { CHECK(gpu); *mode = 1; return OK; }
nvmlReturn_t nvmlDeviceGetComputeMode(gpu_t *gpu, int *mode) { CHECK(gpu); *mode = 0; return OK; }

/* FAKE_NVML_PROCS entries of this GPU, into out (up to max); returns how many there are. */
static unsigned int processes(const gpu_t *gpu, nvmlProcessInfo_t *out, unsigned int max) {
    const char *spec = getenv("FAKE_NVML_PROCS");
    unsigned int n = 0;
    if (!spec) spec = "0:425:64409829376";
    while (*spec) {
        int index = -1;
        unsigned int pid = 0;
        unsigned long long bytes = 0;
        if (sscanf(spec, "%d:%u:%llu", &index, &pid, &bytes) == 3 && index == gpu->index) {
            if (pid == 0) pid = (unsigned int)getpid();
            if (out && n < max) {
                out[n].pid = pid;
                out[n].usedGpuMemory = bytes;
                out[n].gpuInstanceId = out[n].computeInstanceId = 0xFFFFFFFFu;
            }
            n++;
        }
        spec = strchr(spec, ';');
        if (!spec) break;
        spec++;
    }
    return n;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(gpu_t *gpu, unsigned int *n, nvmlProcessInfo_t *infos) {
    CHECK(gpu);
    unsigned int have = processes(gpu, NULL, 0);
    if (have == 0) { *n = 0; return OK; }
    if (infos == NULL || *n < have) { *n = have; return ERR_INSUFFICIENT_SIZE; }
    *n = processes(gpu, infos, *n);
    return OK;
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(gpu_t *gpu, unsigned int *n, nvmlProcessInfo_t *infos) {
    CHECK(gpu);
    (void)infos;
    *n = 0;
    return OK;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(gpu_t *gpu, nvmlProcessUtilizationSample_t *samples, unsigned int *n,
                                             unsigned long long last_seen) {
    nvmlProcessInfo_t infos[16];
    (void)last_seen;
    CHECK(gpu);
    unsigned int have = processes(gpu, infos, 16);
    if (have > 16) have = 16;
    if (have == 0) return ERR_NOT_FOUND; /* no samples: what the driver answers on an idle GPU */
    if (samples == NULL || *n < have) { *n = have; return ERR_INSUFFICIENT_SIZE; }
    for (unsigned int i = 0; i < have; i++) {
        samples[i].pid = infos[i].pid;
        samples[i].timeStamp = 1795347124456688ULL;
        samples[i].smUtil = i == 0 ? 81 : 2;
        samples[i].memUtil = i == 0 ? 31 : 1;
        samples[i].encUtil = samples[i].decUtil = 0;
    }
    *n = have;
    return OK;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(gpu_t *gpu, unsigned int link, int *active) {
    CHECK(gpu);
    if ((int)link >= gpu->nvlinks) return gpu->nvlinks ? ERR_INVALID_ARGUMENT : ERR_NOT_SUPPORTED;
    *active = pair_value("FAKE_NVML_NVLINK_DOWN", gpu->index, -1) == (int)link ? 0 : 1;
    return OK;
}

nvmlReturn_t nvmlDeviceGetFieldValues(gpu_t *gpu, int n, nvmlFieldValue_t *values) {
    CHECK(gpu);
    for (int i = 0; i < n; i++) {
        values[i].valueType = 3; /* unsigned long long */
        values[i].timestamp = 1795347124456688LL;
        values[i].latencyUsec = 0;
        switch (gpu->nvlinks ? values[i].fieldId : 0) {
        case 91: values[i].value.ull = (unsigned long long)gpu->nvlinks; values[i].nvmlReturn = OK; break;
        case 138: values[i].value.ull = 123456789ULL; values[i].nvmlReturn = OK; break; /* KiB sent */
        case 139: values[i].value.ull = 987654321ULL; values[i].nvmlReturn = OK; break; /* KiB received */
        default: values[i].nvmlReturn = ERR_NOT_SUPPORTED;
        }
    }
    return OK;
}

/* "i:n" switches: the value for GPU `index`, else the fallback. */
static int pair_value(const char *name, int index, int fallback) {
    const char *spec = getenv(name);
    int i, n;
    if (spec && sscanf(spec, "%d:%d", &i, &n) == 2 && i == index) return n;
    return fallback;
}

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(gpu_t *gpu, unsigned int *v) {
    CHECK(gpu);
    *v = (unsigned int)pair_value("FAKE_NVML_REPLAYS", gpu->index, 0);
    return OK;
}
nvmlReturn_t nvmlDeviceGetFanSpeed(gpu_t *gpu, unsigned int *percent) { CHECK(gpu); *percent = 45; return OK; }
nvmlReturn_t nvmlDeviceGetFanSpeed_v2(gpu_t *gpu, unsigned int fan, unsigned int *percent) {
    (void)fan;
    return nvmlDeviceGetFanSpeed(gpu, percent);
}
nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(gpu_t *gpu, unsigned int link, int counter, unsigned long long *n) {
    CHECK(gpu);
    if ((int)link >= gpu->nvlinks) return gpu->nvlinks ? ERR_INVALID_ARGUMENT : ERR_NOT_SUPPORTED;
    *n = counter == 1 ? 2ULL : 0ULL; /* CRC data errors: 2 on every link */
    return OK;
}

/* The event set: one per process is all the readers make. */
typedef struct {
    gpu_t *device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
static int event_set, delivered;
static double storm_next;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

nvmlReturn_t nvmlEventSetCreate(void **set) { *set = &event_set; return OK; }
nvmlReturn_t nvmlEventSetFree(void *set) { (void)set; return OK; }
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(gpu_t *gpu, unsigned long long *types) {
    CHECK(gpu);
    *types = 0x8ULL | 0x4ULL | 0x2ULL; /* XID critical error, double-bit ECC, single-bit ECC */
    return OK;
}
nvmlReturn_t nvmlDeviceRegisterEvents(gpu_t *gpu, unsigned long long types, void *set) {
    (void)types; (void)set;
    CHECK(gpu);
    return OK;
}
nvmlReturn_t nvmlEventSetWait_v2(void *set, nvmlEventData_t *data, unsigned int timeoutms) {
    (void)set;
    const char *spec = getenv("FAKE_NVML_XID");
    int skip = delivered, index, code, used;
    while (spec && *spec && sscanf(spec, "%d:%d%n", &index, &code, &used) == 2) {
        if (skip-- == 0 && index >= 0 && index < count()) {
            delivered++;
            memset(data, 0, sizeof *data);
            data->device = &GPUS[index];
            data->eventType = 0x8ULL;
            data->eventData = (unsigned long long)code;
            return OK;
        }
        spec += used;
        if (*spec == ',') spec++;
    }
    int rate = env_int("FAKE_NVML_XID_STORM", 0);
    double deadline = now_s() + timeoutms / 1000.0;
    if (rate > 0) {
        double t = now_s();
        if (storm_next < t - 1.0) storm_next = t; /* no backlog of more than a second */
        if (storm_next <= deadline) {
            if (storm_next > t) usleep((useconds_t)((storm_next - t) * 1e6));
            storm_next += 1.0 / rate;
            memset(data, 0, sizeof *data);
            data->device = &GPUS[0];
            data->eventType = 0x8ULL;
            data->eventData = 13ULL;
            return OK;
        }
    }
    usleep((useconds_t)timeoutms * 1000);
    return ERR_TIMEOUT;
}
