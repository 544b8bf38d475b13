/* A stand-in for libamd_smi.so: two AMD Instinct MI300X GPUs on one socket, served to the real amdsmi
 * Python package (amdsmi_wrapper.py loads it from $ROCM_PATH/lib).
 *
 * The structures come from amdsmi_types.h, which tests/fakeamdsmi.py writes from the package's own ctypes
 * definitions (so the layouts are the ones the installed bindings read, checked by _Static_assert there);
 * every other symbol the bindings bind at import is a weak stub (amdsmi_stubs.c) answering NOT_SUPPORTED.
 *
 * Fault switches (environment):
 *   FAKE_AMDSMI_INIT=<status>        amdsmi_init answers that status (34: driver not loaded)
 *   FAKE_AMDSMI_UNSUPPORTED=a,b      those calls answer NOT_SUPPORTED: power, power_cap, energy, ecc, pcie,
 *                                    clock, temp_edge, activity, processes, uuid, driver
 *   FAKE_AMDSMI_HANG=<index>         every call on that GPU after its bus id blocks for a long time
 *   FAKE_AMDSMI_PROCS=gpu:pid:vram[,...]  processes and their VRAM bytes
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "amdsmi_types.h"

#define OK 0
#define NOT_SUPPORTED 2
#define INVAL 1

typedef struct {
    int index;
    uint64_t bdf;          /* domain << 32 | bus << 8 | device << 3 | function */
    const char *uuid;
    const char *serial;
    uint64_t vram_used_mb;
    uint32_t gfx, umc;
    int64_t edge, hotspot, vram_temp;
    uint32_t power_w, power_cap_uw;
    uint64_t energy_ticks;
    uint32_t gfx_clk, gfx_max, mem_clk, mem_max;
    uint64_t ecc_uncorrectable, ecc_correctable;
    uint16_t width, width_max;
    uint32_t speed_mt, speed_max_mt;  /* MT/s, as amdsmi reports them */
} gpu_t;

static gpu_t gpus[2] = {
    {0, (0ull << 32) | (0x0c << 8), "e2ff74a1-0000-1000-8000-cd1234567801", "8A2F51C0D10B7E01",
     58122, 91, 44, 61, 83, 70, 612, 750000000, 123456789012ull, 2100, 2100, 1300, 1300, 0, 3, 16, 16, 32000,
     32000},
    {1, (0ull << 32) | (0x22 << 8), "e2ff74a1-0000-1000-8000-cd1234567802", "8A2F51C0D10B7E02",
     283, 0, 0, 38, 45, 36, 141, 750000000, 98765432109ull, 132, 2100, 900, 1300, 2, 0, 16, 16, 32000, 32000},
};
static int socket_marker;

static int unsupported(const char *name) {
    const char *list = getenv("FAKE_AMDSMI_UNSUPPORTED");
    if (!list) return 0;
    size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)) != NULL; p += n) {
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) return 1;
    }
    return 0;
}

/* The GPU behind a handle, blocking when it is the one set to hang. */
static gpu_t *gpu_of(void *handle, int may_hang) {
    gpu_t *gpu = (gpu_t *)handle;
    const char *hang = getenv("FAKE_AMDSMI_HANG");
    if (may_hang && hang && atoi(hang) == gpu->index) sleep(600);
    return gpu;
}

static void copy(char *dst, size_t size, const char *src) {
    strncpy(dst, src, size - 1);
    dst[size - 1] = '\0';
}

int amdsmi_init(uint64_t flags) {
    (void)flags;
    const char *status = getenv("FAKE_AMDSMI_INIT");
    return status ? atoi(status) : OK;
}

int amdsmi_shut_down(void) { return OK; }

int amdsmi_get_socket_handles(uint32_t *count, void **handles) {
    if (handles) handles[0] = &socket_marker;
    *count = 1;
    return OK;
}

int amdsmi_get_processor_handles(void *socket, uint32_t *count, void **handles) {
    if (socket != &socket_marker) return INVAL;
    if (handles) {
        for (int i = 0; i < 2 && (uint32_t)i < *count; i++) handles[i] = &gpus[i];
    }
    *count = 2;
    return OK;
}

int amdsmi_get_gpu_bdf_id(void *handle, uint64_t *bdfid) {
    *bdfid = gpu_of(handle, 0)->bdf;
    return OK;
}

int amdsmi_get_gpu_asic_info(void *handle, amdsmi_asic_info_t *info) {
    gpu_t *gpu = gpu_of(handle, 0);
    memset(info, 0, sizeof(*info));
    copy(info->market_name, sizeof(info->market_name), "AMD Instinct MI300X");
    copy(info->vendor_name, sizeof(info->vendor_name), "Advanced Micro Devices Inc. [AMD/ATI]");
    copy(info->asic_serial, sizeof(info->asic_serial), gpu->serial);
    info->vendor_id = 0x1002;
    info->device_id = 0x74a1;
    info->subvendor_id = 0x1002;
    info->subsystem_id = 0x74a1;
    info->rev_id = 0;
    info->oam_id = gpu->index;
    info->num_of_compute_units = 304;
    info->target_graphics_version = 0x942;
    return OK;
}

int amdsmi_get_gpu_device_uuid(void *handle, uint32_t *length, char *uuid) {
    gpu_t *gpu = gpu_of(handle, 1);
    if (unsupported("uuid")) return NOT_SUPPORTED;
    if (*length < strlen(gpu->uuid) + 1) return 41; /* INSUFFICIENT_SIZE */
    strcpy(uuid, gpu->uuid);
    *length = (uint32_t)strlen(gpu->uuid);
    return OK;
}

int amdsmi_get_gpu_vram_usage(void *handle, amdsmi_vram_usage_t *usage) {
    gpu_t *gpu = gpu_of(handle, 1);
    usage->vram_total = 196592; /* MB, MI300X's 192 GB */
    usage->vram_used = (uint32_t)gpu->vram_used_mb;
    return OK;
}

int amdsmi_get_gpu_activity(void *handle, amdsmi_engine_usage_t *usage) {
    gpu_t *gpu = gpu_of(handle, 1);
    if (unsupported("activity")) return NOT_SUPPORTED;
    usage->gfx_activity = gpu->gfx;
    usage->umc_activity = gpu->umc;
    usage->mm_activity = 0xFFFF; /* amdsmi's "N/A" */
    return OK;
}

int amdsmi_get_temp_metric(void *handle, int sensor, int metric, int64_t *value) {
    gpu_t *gpu = gpu_of(handle, 1);
    if (metric != 0) return NOT_SUPPORTED; /* only AMDSMI_TEMP_CURRENT */
    switch (sensor) {
    case 0: if (unsupported("temp_edge")) return NOT_SUPPORTED; *value = gpu->edge; return OK;
    case 1: *value = gpu->hotspot; return OK; /* HOTSPOT, also named JUNCTION */
    case 2: *value = gpu->vram_temp; return OK;
    default: return NOT_SUPPORTED;
    }
}

int amdsmi_get_power_info(void *handle, amdsmi_power_info_t *info) {
    gpu_t *gpu = gpu_of(handle, 1);
    if (unsupported("power")) return NOT_SUPPORTED;
    memset(info, 0, sizeof(*info));
    info->current_socket_power = gpu->power_w;
    info->average_socket_power = 0xFFFF; /* MI300X reports current power only */
    info->socket_power = gpu->power_w;
    info->gfx_voltage = 0xFFFF;
    info->soc_voltage = 0xFFFF;
    info->mem_voltage = 0xFFFF;
    info->power_limit = gpu->power_cap_uw / 1000000;
    return OK;
}

int amdsmi_get_power_cap_info(void *handle, uint32_t sensor, amdsmi_power_cap_info_t *info) {
    gpu_t *gpu = gpu_of(handle, 1);
    (void)sensor;
    if (unsupported("power_cap")) return NOT_SUPPORTED;
    memset(info, 0, sizeof(*info));
    info->power_cap = gpu->power_cap_uw;
    info->default_power_cap = gpu->power_cap_uw;
    info->min_power_cap = 0;
    info->max_power_cap = gpu->power_cap_uw;
    return OK;
}

int amdsmi_get_energy_count(void *handle, uint64_t *energy, float *resolution, uint64_t *timestamp) {
    gpu_t *gpu = gpu_of(handle, 1);
    if (unsupported("energy")) return NOT_SUPPORTED;
    *energy = gpu->energy_ticks;
    *resolution = 15.3f; /* microjoules per tick, as the SMU counts */
    *timestamp = 1763840000000000000ull;
    return OK;
}

int amdsmi_get_clock_info(void *handle, int type, amdsmi_clk_info_t *info) {
    gpu_t *gpu = gpu_of(handle, 1);
    if (unsupported("clock")) return NOT_SUPPORTED;
    memset(info, 0, sizeof(*info));
    if (type == 0) { /* AMDSMI_CLK_TYPE_GFX (== SYS) */
        info->clk = gpu->gfx_clk; info->min_clk = 132; info->max_clk = gpu->gfx_max;
    } else if (type == 4) { /* AMDSMI_CLK_TYPE_MEM */
        info->clk = gpu->mem_clk; info->min_clk = 900; info->max_clk = gpu->mem_max;
    } else {
        return NOT_SUPPORTED;
    }
    return OK;
}

int amdsmi_get_gpu_total_ecc_count(void *handle, amdsmi_error_count_t *count) {
    gpu_t *gpu = gpu_of(handle, 1);
    if (unsupported("ecc")) return NOT_SUPPORTED;
    memset(count, 0, sizeof(*count));
    count->correctable_count = gpu->ecc_correctable;
    count->uncorrectable_count = gpu->ecc_uncorrectable;
    return OK;
}

int amdsmi_get_pcie_info(void *handle, amdsmi_pcie_info_t *info) {
    gpu_t *gpu = gpu_of(handle, 1);
    if (unsupported("pcie")) return NOT_SUPPORTED;
    memset(info, 0, sizeof(*info));
    info->pcie_static.max_pcie_width = gpu->width_max;
    info->pcie_static.max_pcie_speed = gpu->speed_max_mt;
    info->pcie_static.pcie_interface_version = 5;
    info->pcie_metric.pcie_width = gpu->width;
    info->pcie_metric.pcie_speed = gpu->speed_mt;
    return OK;
}

int amdsmi_get_gpu_process_list(void *handle, uint32_t *max, amdsmi_proc_info_t *list) {
    gpu_t *gpu = gpu_of(handle, 1);
    if (unsupported("processes")) return NOT_SUPPORTED;
    const char *spec = getenv("FAKE_AMDSMI_PROCS");
    uint32_t found = 0;
    char buffer[512];
    copy(buffer, sizeof(buffer), spec ? spec : "");
    char *rest = NULL;  /* strtok_r: the reader asks each GPU from a thread of its own, at once */
    for (char *item = strtok_r(buffer, ",", &rest); item; item = strtok_r(NULL, ",", &rest)) {
        int index = 0;
        unsigned pid = 0;
        unsigned long long vram = 0;
        if (sscanf(item, "%d:%u:%llu", &index, &pid, &vram) != 3 || index != gpu->index) continue;
        if (found < *max) {
            amdsmi_proc_info_t *p = &list[found];
            memset(p, 0, sizeof(*p));
            copy(p->name, sizeof(p->name), "python3");
            p->pid = pid;
            p->mem = vram;
            p->memory_usage.vram_mem = vram;
            p->engine_usage.gfx = 1000000;
        }
        found++;
    }
    *max = found;
    return OK;
}

int amdsmi_get_gpu_driver_info(void *handle, amdsmi_driver_info_t *info) {
    gpu_of(handle, 1);
    if (unsupported("driver")) return NOT_SUPPORTED;
    memset(info, 0, sizeof(*info));
    copy(info->driver_name, sizeof(info->driver_name), "amdgpu");
    copy(info->driver_version, sizeof(info->driver_version), "6.12.12");
    copy(info->driver_date, sizeof(info->driver_date), "2015/01/01 00:00");
    return OK;
}
