/* A scripted NVML for gpuenv's tests: libnvidia-ml.so.1 built against NVIDIA's own
 * nvml.h (PyPI nvidia-nvml-dev), so every signature is the one the real library exports,
 * and loaded by the real nvidia-ml-py (pynvml dlopens "libnvidia-ml.so.1": put this
 * folder on LD_LIBRARY_PATH). What it reports comes from the JSON file named by
 * GPUENV_TEST_NVML, reread whenever that file changes (docs/development/index.md,
 * "The scripted NVML").
 *
 * A reading the script does not give answers NVML_ERROR_NOT_SUPPORTED, as on a GPU that
 * lacks the sensor; "lost" and "fail" script NVML_ERROR_GPU_IS_LOST and any other error.
 * Never part of the gpuenv package.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "nvml.h"

#define MAX_GPUS 64
#define MAX_MIG 8
#define MAX_KEYS 8192
#define MAX_SETS 16

/* ---- the script: JSON flattened into "path = value" pairs (gpus.0.pcie.gen = 4) ---- */

static char *keys[MAX_KEYS];
static char *values[MAX_KEYS];
static int nkeys;
static char *text;
static size_t pos;
static int parse_failed;
static struct stat loaded;
static int initialized;

static void add(const char *path, const char *value, size_t length) {
    if (nkeys >= MAX_KEYS) {
        parse_failed = 1;
        return;
    }
    keys[nkeys] = strdup(path);
    values[nkeys] = strndup(value, length);
    nkeys++;
}

static void skip_space(void) {
    while (text[pos] == ' ' || text[pos] == '\n' || text[pos] == '\r' || text[pos] == '\t') pos++;
}

static void parse_value(const char *path);

static int parse_string(char *out, size_t size) {
    size_t n = 0;
    if (text[pos] != '"') return -1;
    pos++;
    while (text[pos] && text[pos] != '"') {
        char c = text[pos++];
        if (c == '\\') {
            c = text[pos++];
            if (c == 'n') c = '\n';
            else if (c == 't') c = '\t';
            else if (c == 'u') { /* keep it simple: non-ASCII escapes become '?' */
                if (strlen(text + pos) < 4) return -1;
                pos += 4;
                c = '?';
            } else if (c == '\0') return -1;
        }
        if (n + 1 < size) out[n++] = c;
    }
    if (text[pos] != '"') return -1;
    pos++;
    out[n] = '\0';
    return 0;
}

static void parse_value(const char *path) {
    char child[512];
    skip_space();
    if (parse_failed) return;
    if (text[pos] == '{') {
        pos++;
        skip_space();
        if (text[pos] == '}') { pos++; return; }
        for (;;) {
            char name[256];
            skip_space();
            if (parse_string(name, sizeof name)) { parse_failed = 1; return; }
            skip_space();
            if (text[pos++] != ':') { parse_failed = 1; return; }
            snprintf(child, sizeof child, "%s%s%s", path, *path ? "." : "", name);
            parse_value(child);
            if (parse_failed) return;
            skip_space();
            if (text[pos] == ',') { pos++; continue; }
            if (text[pos] == '}') { pos++; return; }
            parse_failed = 1;
            return;
        }
    }
    if (text[pos] == '[') {
        int count = 0;
        char number[16];
        pos++;
        skip_space();
        if (text[pos] != ']') {
            for (;;) {
                snprintf(child, sizeof child, "%s.%d", path, count++);
                parse_value(child);
                if (parse_failed) return;
                skip_space();
                if (text[pos] == ',') { pos++; continue; }
                if (text[pos] == ']') break;
                parse_failed = 1;
                return;
            }
        }
        pos++;
        snprintf(child, sizeof child, "%s.#", path);
        snprintf(number, sizeof number, "%d", count);
        add(child, number, strlen(number));
        return;
    }
    if (text[pos] == '"') {
        char value[512];
        if (parse_string(value, sizeof value)) { parse_failed = 1; return; }
        add(path, value, strlen(value));
        return;
    }
    if (strncmp(text + pos, "true", 4) == 0) { add(path, "1", 1); pos += 4; return; }
    if (strncmp(text + pos, "false", 5) == 0) { add(path, "0", 1); pos += 5; return; }
    if (strncmp(text + pos, "null", 4) == 0) { pos += 4; return; }
    {
        size_t start = pos;
        while (text[pos] && strchr("+-0123456789.eE", text[pos])) pos++;
        if (pos == start) { parse_failed = 1; return; }
        add(path, text + start, pos - start);
    }
}

static void forget(void) {
    for (int i = 0; i < nkeys; i++) { free(keys[i]); free(values[i]); }
    nkeys = 0;
}

/* Reread the script when its file changed (another inode, size or mtime). */
static void load(void) {
    const char *path = getenv("GPUENV_TEST_NVML");
    struct stat now;
    FILE *file;
    long size;
    if (!path || stat(path, &now) != 0) {
        forget();
        memset(&loaded, 0, sizeof loaded);
        return;
    }
    if (now.st_ino == loaded.st_ino && now.st_size == loaded.st_size &&
        now.st_mtim.tv_sec == loaded.st_mtim.tv_sec && now.st_mtim.tv_nsec == loaded.st_mtim.tv_nsec)
        return;
    file = fopen(path, "rb");
    if (!file) return;
    fseek(file, 0, SEEK_END);
    size = ftell(file);
    rewind(file);
    free(text);
    text = calloc(1, (size_t)size + 1);
    if (!text || fread(text, 1, (size_t)size, file) != (size_t)size) { fclose(file); return; }
    fclose(file);
    forget();
    pos = 0;
    parse_failed = 0;
    parse_value("");
    if (parse_failed) {
        fprintf(stderr, "scripted NVML: %s is not valid JSON (near byte %zu)\n", path, pos);
        forget();
    }
    loaded = now;
}

static const char *get(const char *format, ...) __attribute__((format(printf, 1, 2)));
static const char *get(const char *format, ...) {
    char path[512];
    va_list args;
    va_start(args, format);
    vsnprintf(path, sizeof path, format, args);
    va_end(args);
    for (int i = 0; i < nkeys; i++)
        if (strcmp(keys[i], path) == 0) return values[i];
    return NULL;
}

static void trace(const char *function) {
    const char *path = getenv("GPUENV_TEST_NVML_LOG");
    FILE *log;
    if (!path || !(log = fopen(path, "a"))) return;
    fprintf(log, "%s\n", function);
    fclose(log);
}

/* ---- errors by name, as the script spells them ("GPU_IS_LOST") ---- */

static const struct { const char *name; nvmlReturn_t code; const char *text; } ERRORS[] = {
    {"SUCCESS", NVML_SUCCESS, "Success"},
    {"UNINITIALIZED", NVML_ERROR_UNINITIALIZED, "Uninitialized"},
    {"INVALID_ARGUMENT", NVML_ERROR_INVALID_ARGUMENT, "Invalid Argument"},
    {"NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED, "Not Supported"},
    {"NO_PERMISSION", NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"},
    {"NOT_FOUND", NVML_ERROR_NOT_FOUND, "Not Found"},
    {"INSUFFICIENT_SIZE", NVML_ERROR_INSUFFICIENT_SIZE, "Insufficient Size"},
    {"DRIVER_NOT_LOADED", NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"},
    {"TIMEOUT", NVML_ERROR_TIMEOUT, "Timeout"},
    {"LIBRARY_NOT_FOUND", NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"},
    {"GPU_IS_LOST", NVML_ERROR_GPU_IS_LOST, "GPU is lost"},
    {"RESET_REQUIRED", NVML_ERROR_RESET_REQUIRED, "GPU requires restart"},
    {"LIB_RM_VERSION_MISMATCH", NVML_ERROR_LIB_RM_VERSION_MISMATCH,
     "RM has detected an NVML/RM version mismatch."},
    {"UNKNOWN", NVML_ERROR_UNKNOWN, "Unknown Error"},
};

static nvmlReturn_t error_named(const char *name) {
    for (size_t i = 0; i < sizeof ERRORS / sizeof *ERRORS; i++)
        if (strcmp(ERRORS[i].name, name) == 0) return ERRORS[i].code;
    return NVML_ERROR_UNKNOWN;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    for (size_t i = 0; i < sizeof ERRORS / sizeof *ERRORS; i++)
        if (ERRORS[i].code == result) return ERRORS[i].text;
    return "Unknown Error";
}

/* ---- handles: one static struct per GPU and per MIG device ---- */

struct nvmlDevice_st {
    int gpu;
    int mig; /* -1: the physical GPU */
};
static struct nvmlDevice_st GPUS[MAX_GPUS];
static struct nvmlDevice_st MIGS[MAX_GPUS][MAX_MIG];

static int gpu_count(void) {
    const char *count = get("gpus.#");
    int n = count ? atoi(count) : 0;
    return n > MAX_GPUS ? MAX_GPUS : n;
}

/* Every device query starts here: initialized, a known handle, not lost, not failed. */
static nvmlReturn_t enter(nvmlDevice_t device, const char *function) {
    const char *lost, *failure;
    trace(function);
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    load();
    if (!device || device->gpu < 0 || device->gpu >= gpu_count()) return NVML_ERROR_INVALID_ARGUMENT;
    lost = get("gpus.%d.lost", device->gpu);
    if (lost && strcmp(lost, "0") != 0) return NVML_ERROR_GPU_IS_LOST;
    failure = get("gpus.%d.fail.%s", device->gpu, function);
    if (failure) return error_named(failure);
    return NVML_SUCCESS;
}

/* A reading of this device (a MIG device reads its own "mig.N.*" first). */
static const char *reading(nvmlDevice_t device, const char *name) {
    const char *value = NULL;
    if (device->mig >= 0) value = get("gpus.%d.mig.%d.%s", device->gpu, device->mig, name);
    return value ? value : get("gpus.%d.%s", device->gpu, name);
}

static nvmlReturn_t number(nvmlDevice_t device, const char *name, unsigned long long *out) {
    const char *value = reading(device, name);
    if (!value) return NVML_ERROR_NOT_SUPPORTED;
    *out = strtoull(value, NULL, 10);
    return NVML_SUCCESS;
}

static nvmlReturn_t text_out(const char *value, char *out, unsigned int length) {
    if (!value) return NVML_ERROR_NOT_SUPPORTED;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, value);
    return NVML_SUCCESS;
}

#define ENTER(device)                                   \
    do {                                                \
        nvmlReturn_t entered = enter(device, __func__); \
        if (entered != NVML_SUCCESS) return entered;    \
    } while (0)

#define UINT_READING(device, name, out)                          \
    do {                                                         \
        unsigned long long value;                                \
        nvmlReturn_t found;                                      \
        ENTER(device);                                           \
        if (!(out)) return NVML_ERROR_INVALID_ARGUMENT;          \
        if ((found = number(device, name, &value))) return found; \
        *(out) = (unsigned int)value;                            \
        return NVML_SUCCESS;                                     \
    } while (0)

/* ---- library and system ---- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    const char *failure;
    (void)flags;
    trace(__func__);
    load();
    /* No script: a machine with NVIDIA's library but no driver loaded. */
    if (!getenv("GPUENV_TEST_NVML")) return NVML_ERROR_DRIVER_NOT_LOADED;
    failure = get("init_error");
    if (failure) return error_named(failure);
    initialized++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    trace(__func__);
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    initialized--;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    trace(__func__);
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    load();
    return text_out(get("driver"), version, length);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    trace(__func__);
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    return text_out("13.580.00", version, length);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    const char *value;
    trace(__func__);
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    load();
    if (!(value = get("cuda_driver"))) return NVML_ERROR_NOT_SUPPORTED;
    *cudaDriverVersion = atoi(value);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    return nvmlSystemGetCudaDriverVersion_v2(cudaDriverVersion);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    trace(__func__);
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    load();
    *deviceCount = (unsigned int)gpu_count();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    const char *lost;
    trace(__func__);
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    load();
    if (index >= (unsigned int)gpu_count() || !device) return NVML_ERROR_INVALID_ARGUMENT;
    lost = get("gpus.%u.lost", index);
    /* "lost": "handle" fails already here, as some drivers do; "lost": true on queries. */
    if (lost && strcmp(lost, "handle") == 0) return NVML_ERROR_GPU_IS_LOST;
    GPUS[index].gpu = (int)index;
    GPUS[index].mig = -1;
    *device = &GPUS[index];
    return NVML_SUCCESS;
}

/* ---- identity ---- */

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    ENTER(device);
    return text_out(reading(device, "name"), name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    ENTER(device);
    return text_out(reading(device, "uuid"), uuid, length);
}

nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t *type) {
    unsigned long long value;
    nvmlReturn_t found;
    ENTER(device);
    if ((found = number(device, "brand", &value))) return found;
    *type = (nvmlBrandType_t)value;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    const char *value;
    ENTER(device);
    if (!(value = reading(device, "compute_capability"))) return NVML_ERROR_NOT_SUPPORTED;
    if (sscanf(value, "%d.%d", major, minor) != 2) return NVML_ERROR_UNKNOWN;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    const char *bus;
    ENTER(device);
    if (!(bus = reading(device, "pci_bus_id"))) return NVML_ERROR_NOT_SUPPORTED;
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", bus);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", bus);
    return NVML_SUCCESS;
}

/* ---- live state ---- */

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    unsigned long long total, used = 0;
    nvmlReturn_t found;
    ENTER(device);
    if ((found = number(device, "memory_total_mib", &total))) return found;
    number(device, "memory_used_mib", &used);
    memory->total = total << 20;
    memory->used = used << 20;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    unsigned long long gpu, memory = 0;
    nvmlReturn_t found;
    const char *mode;
    ENTER(device);
    /* nvml.h: "On MIG-enabled GPUs, querying device utilization rates is not currently
     * supported": a GPU in MIG mode answers NOT_SUPPORTED; a MIG device has its own
     * reading (a script may give one) or none. */
    if (device->mig < 0 && (mode = get("gpus.%d.mig_mode", device->gpu)) && strcmp(mode, "1") == 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (device->mig >= 0 && !get("gpus.%d.mig.%d.utilization", device->gpu, device->mig))
        return NVML_ERROR_NOT_SUPPORTED;
    if ((found = number(device, "utilization", &gpu))) return found;
    number(device, "memory_utilization", &memory);
    utilization->gpu = (unsigned int)gpu;
    utilization->memory = (unsigned int)memory;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensor,
                                      unsigned int *temp) {
    if (sensor != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    UINT_READING(device, "temperature_c", temp);
}

nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device,
                                               nvmlTemperatureThresholds_t threshold,
                                               unsigned int *temp) {
    static const char *NAMES[] = {"shutdown_c", "slowdown_c", "memory_max_c", "gpu_max_c"};
    if ((unsigned int)threshold >= sizeof NAMES / sizeof *NAMES) return NVML_ERROR_NOT_SUPPORTED;
    UINT_READING(device, NAMES[threshold], temp);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    UINT_READING(device, "power_mw", power);
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    UINT_READING(device, "power_limit_mw", limit);
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                    unsigned long long *reasons) {
    nvmlReturn_t found;
    ENTER(device);
    if ((found = number(device, "clocks_event_reasons", reasons))) return found;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                       unsigned long long *reasons) {
    return nvmlDeviceGetCurrentClocksEventReasons(device, reasons);
}

static const char *CLOCKS[] = {"graphics", "sm", "memory", "video"};

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                    unsigned int *clock) {
    char name[32];
    if ((unsigned int)type >= 4) return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(name, sizeof name, "clocks_mhz.%s", CLOCKS[type]);
    UINT_READING(device, name, clock);
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                       unsigned int *clock) {
    char name[32];
    if ((unsigned int)type >= 4) return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(name, sizeof name, "max_clocks_mhz.%s", CLOCKS[type]);
    UINT_READING(device, name, clock);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen) {
    UINT_READING(device, "pcie.gen", gen);
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen) {
    UINT_READING(device, "pcie.max_gen", gen);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *width) {
    UINT_READING(device, "pcie.width", width);
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *width) {
    UINT_READING(device, "pcie.max_width", width);
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                         nvmlEccCounterType_t counterType,
                                         unsigned long long *eccCounts) {
    char name[48];
    ENTER(device);
    if ((unsigned int)errorType > 1 || (unsigned int)counterType > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(name, sizeof name, "ecc.%s_%s",
             errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED ? "corrected" : "uncorrected",
             counterType == NVML_VOLATILE_ECC ? "volatile" : "aggregate");
    return number(device, name, eccCounts);
}

/* processes: "processes": [{"pid": 4242, "used_memory_mib": 1024}, ...] */
/* A device's processes: a MIG device lists only its own ("mig": [{"processes": [...]}]),
 * with its GPU and compute instance ids, as NVML does for a MIG device handle. */
static nvmlReturn_t processes(nvmlDevice_t device, const char *list, unsigned int *count,
                              nvmlProcessInfo_t *infos) {
    char base[64];
    const char *length;
    unsigned long long gi = 0xFFFFFFFF, ci = 0xFFFFFFFF;
    unsigned int n;
    int name = (int)strlen(list) - 2;
    if (device->mig >= 0) {
        snprintf(base, sizeof base, "gpus.%d.mig.%d", device->gpu, device->mig);
        number(device, "gpu_instance", &gi);
        number(device, "compute_instance", &ci);
    } else {
        snprintf(base, sizeof base, "gpus.%d", device->gpu);
    }
    length = get("%s.%s", base, list);
    n = length ? (unsigned int)atoi(length) : 0;
    if (!length) return NVML_ERROR_NOT_SUPPORTED;
    if (*count < n || !infos) {
        *count = n;
        return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    for (unsigned int i = 0; i < n; i++) {
        const char *pid = get("%s.%.*s.%u.pid", base, name, list, i);
        const char *used = get("%s.%.*s.%u.used_memory_mib", base, name, list, i);
        infos[i].pid = pid ? (unsigned int)atoi(pid) : 0;
        infos[i].usedGpuMemory = used ? strtoull(used, NULL, 10) << 20 : 0;
        infos[i].gpuInstanceId = (unsigned int)gi;
        infos[i].computeInstanceId = (unsigned int)ci;
    }
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos) {
    ENTER(device);
    return processes(device, "processes.#", infoCount, infos);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos) {
    ENTER(device);
    return processes(device, "graphics_processes.#", infoCount, infos);
}

/* ---- MIG: "mig_mode": 1, "max_mig_devices": 7, "mig": [{"uuid": "MIG-...", ...}] ---- */

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                  unsigned int *pendingMode) {
    unsigned long long mode, pending;
    nvmlReturn_t found;
    ENTER(device);
    if (device->mig >= 0) return NVML_ERROR_NOT_SUPPORTED;
    if ((found = number(device, "mig_mode", &mode))) return found;
    pending = mode;
    number(device, "mig_pending_mode", &pending);
    *currentMode = (unsigned int)mode;
    *pendingMode = (unsigned int)pending;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    UINT_READING(device, "max_mig_devices", count);
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                 nvmlDevice_t *migDevice) {
    const char *length, *mode;
    ENTER(device);
    mode = get("gpus.%d.mig_mode", device->gpu);
    if (device->mig >= 0 || !mode || strcmp(mode, "1") != 0) return NVML_ERROR_NOT_SUPPORTED;
    length = get("gpus.%d.mig.#", device->gpu);
    if (!length || index >= (unsigned int)atoi(length) || index >= MAX_MIG)
        return NVML_ERROR_NOT_FOUND;
    MIGS[device->gpu][index].gpu = device->gpu;
    MIGS[device->gpu][index].mig = (int)index;
    *migDevice = &MIGS[device->gpu][index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                          nvmlDevice_t *device) {
    ENTER(migDevice);
    if (migDevice->mig < 0) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &GPUS[migDevice->gpu];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    ENTER(device);
    *isMigDevice = device->mig >= 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    if (device && device->mig < 0) return NVML_ERROR_NOT_SUPPORTED;
    UINT_READING(device, "gpu_instance", id);
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    if (device && device->mig < 0) return NVML_ERROR_NOT_SUPPORTED;
    UINT_READING(device, "compute_instance", id);
}

/* ---- GPU instances and their profiles, by the MIG device's "gpu_instance" and
 * "profile": {"id": 19, "name": "MIG 1g.10gb", "slices": 1, "memory_mb": 9728}; the
 * device attributes from "attributes": {"gi_slices", "ci_slices", "memory_mb"} ---- */

struct nvmlGpuInstance_st {
    int gpu;
    int mig;
};
static struct nvmlGpuInstance_st INSTANCES[MAX_GPUS][MAX_MIG];

static int mig_count(int gpu) {
    const char *length = get("gpus.%d.mig.#", gpu);
    int n = length ? atoi(length) : 0;
    return n > MAX_MIG ? MAX_MIG : n;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                          nvmlGpuInstance_t *gpuInstance) {
    ENTER(device);
    if (device->mig >= 0 || !gpuInstance) return NVML_ERROR_INVALID_ARGUMENT;
    for (int m = 0; m < mig_count(device->gpu); m++) {
        const char *instance = get("gpus.%d.mig.%d.gpu_instance", device->gpu, m);
        if (instance && strtoul(instance, NULL, 10) == id) {
            INSTANCES[device->gpu][m].gpu = device->gpu;
            INSTANCES[device->gpu][m].mig = m;
            *gpuInstance = &INSTANCES[device->gpu][m];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info) {
    struct nvmlDevice_st *mig;
    unsigned long long id, profile, start = 0, size = 0;
    if (!gpuInstance || !info) return NVML_ERROR_INVALID_ARGUMENT;
    mig = &MIGS[gpuInstance->gpu][gpuInstance->mig];
    mig->gpu = gpuInstance->gpu;
    mig->mig = gpuInstance->mig;
    ENTER(mig);
    if (number(mig, "gpu_instance", &id) || number(mig, "profile.id", &profile))
        return NVML_ERROR_NOT_SUPPORTED;
    number(mig, "placement.start", &start);
    number(mig, "placement.size", &size);
    memset(info, 0, sizeof *info);
    info->device = &GPUS[mig->gpu];
    info->id = (unsigned int)id;
    info->profileId = (unsigned int)profile;
    info->placement.start = (unsigned int)start;
    info->placement.size = (unsigned int)size;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoByIdV(nvmlDevice_t device, unsigned int profileId,
                                                      nvmlGpuInstanceProfileInfo_v2_t *info) {
    ENTER(device);
    if (device->mig >= 0 || !info || info->version != nvmlGpuInstanceProfileInfo_v2)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int m = 0; m < mig_count(device->gpu); m++) {
        const char *id = get("gpus.%d.mig.%d.profile.id", device->gpu, m);
        const char *name = get("gpus.%d.mig.%d.profile.name", device->gpu, m);
        const char *slices = get("gpus.%d.mig.%d.profile.slices", device->gpu, m);
        const char *memory = get("gpus.%d.mig.%d.profile.memory_mb", device->gpu, m);
        if (!id || strtoul(id, NULL, 10) != profileId) continue;
        unsigned int version = info->version;
        memset(info, 0, sizeof *info);
        info->version = version;
        info->id = profileId;
        info->sliceCount = slices ? (unsigned int)strtoul(slices, NULL, 10) : 0;
        info->memorySizeMB = memory ? strtoull(memory, NULL, 10) : 0;
        if (name) snprintf(info->name, sizeof info->name, "%s", name);
        return NVML_SUCCESS;
    }
    return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes) {
    unsigned long long gi, ci, memory;
    ENTER(device);
    if (!attributes) return NVML_ERROR_INVALID_ARGUMENT;
    if (number(device, "attributes.gi_slices", &gi) || number(device, "attributes.memory_mb", &memory))
        return NVML_ERROR_NOT_SUPPORTED;
    ci = gi;
    number(device, "attributes.ci_slices", &ci);
    memset(attributes, 0, sizeof *attributes);
    attributes->gpuInstanceSliceCount = (unsigned int)gi;
    attributes->computeInstanceSliceCount = (unsigned int)ci;
    attributes->memorySizeMB = memory;
    return NVML_SUCCESS;
}

/* ---- events: each event set gets every XID the script lists, once ("xids": [79]) ---- */

struct nvmlEventSet_st {
    int used;
    unsigned long long types[MAX_GPUS];
    int delivered[MAX_GPUS];
};
static struct nvmlEventSet_st SETS[MAX_SETS];

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    trace(__func__);
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    for (int i = 0; i < MAX_SETS; i++)
        if (!SETS[i].used) {
            memset(&SETS[i], 0, sizeof SETS[i]);
            SETS[i].used = 1;
            *set = &SETS[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_MEMORY;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes) {
    ENTER(device);
    *eventTypes = nvmlEventTypeXidCriticalError;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                      nvmlEventSet_t set) {
    ENTER(device);
    if (!set || !set->used || device->mig >= 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (eventTypes & ~(unsigned long long)nvmlEventTypeXidCriticalError)
        return NVML_ERROR_NOT_SUPPORTED;
    set->types[device->gpu] |= eventTypes;
    return NVML_SUCCESS;
}

static nvmlReturn_t next_event(nvmlEventSet_t set, nvmlEventData_t *data) {
    load();
    for (int gpu = 0; gpu < gpu_count(); gpu++) {
        const char *length = get("gpus.%d.xids.#", gpu), *xid;
        if (!(set->types[gpu] & nvmlEventTypeXidCriticalError) || !length) continue;
        if (set->delivered[gpu] >= atoi(length)) continue;
        xid = get("gpus.%d.xids.%d", gpu, set->delivered[gpu]++);
        GPUS[gpu].gpu = gpu;
        GPUS[gpu].mig = -1;
        data->device = &GPUS[gpu];
        data->eventType = nvmlEventTypeXidCriticalError;
        data->eventData = xid ? strtoull(xid, NULL, 10) : 999;
        data->gpuInstanceId = 0xFFFFFFFF;
        data->computeInstanceId = 0xFFFFFFFF;
        return NVML_SUCCESS;
    }
    return NVML_ERROR_TIMEOUT;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    struct timespec pause = {timeoutms / 1000, (long)(timeoutms % 1000) * 1000000L};
    trace(__func__);
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!set || !set->used || !data) return NVML_ERROR_INVALID_ARGUMENT;
    if (next_event(set, data) == NVML_SUCCESS) return NVML_SUCCESS;
    while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {
    }
    return next_event(set, data);
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    trace(__func__);
    if (!set || !set->used) return NVML_ERROR_INVALID_ARGUMENT;
    set->used = 0;
    return NVML_SUCCESS;
}
