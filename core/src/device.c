/* device.c: read a GPU's properties through the CUDA driver API, opened with dlopen at run time. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* The few driver API types and numbers the core needs, from cuda.h, so no CUDA header or
 * library is needed to build or run the core. */
typedef int ap_cu_result;
typedef int ap_cu_device;
typedef ap_cu_result (*ap_cu_init_fn)(unsigned int flags);
typedef ap_cu_result (*ap_cu_device_get_count_fn)(int *count);
typedef ap_cu_result (*ap_cu_device_get_fn)(ap_cu_device *device, int ordinal);
typedef ap_cu_result (*ap_cu_device_get_attribute_fn)(int *value, int attribute,
                                                      ap_cu_device device);
typedef ap_cu_result (*ap_cu_device_get_name_fn)(char *name, int length, ap_cu_device device);
typedef ap_cu_result (*ap_cu_device_total_mem_fn)(size_t *bytes, ap_cu_device device);
typedef ap_cu_result (*ap_cu_driver_get_version_fn)(int *version);
typedef ap_cu_result (*ap_cu_get_error_name_fn)(ap_cu_result error, const char **name);

#define AP_CU_SUCCESS 0
#define AP_CU_ATTR_MULTIPROCESSOR_COUNT 16
#define AP_CU_ATTR_L2_CACHE_SIZE 38
#define AP_CU_ATTR_COMPUTE_CAPABILITY_MAJOR 75
#define AP_CU_ATTR_COMPUTE_CAPABILITY_MINOR 76
#define AP_CU_ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN 97

/* The driver, loaded once per process and never closed: instances of CUDA plugins use it too. */
typedef struct ap_cuda_driver {
    void *handle;
    ap_cu_init_fn init;
    ap_cu_device_get_count_fn device_get_count;
    ap_cu_device_get_fn device_get;
    ap_cu_device_get_attribute_fn device_get_attribute;
    ap_cu_device_get_name_fn device_get_name;
    ap_cu_device_total_mem_fn device_total_mem;
    ap_cu_driver_get_version_fn driver_get_version;
    ap_cu_get_error_name_fn get_error_name; /* optional: only for messages */
    int driver_version;
    char failure[160]; /* why the driver is unusable; "" when it is */
} ap_cuda_driver;

static ap_cuda_driver ap_driver;
static pthread_once_t ap_driver_once = PTHREAD_ONCE_INIT;

static void ap_driver_describe_error(ap_cu_result result, char *out, size_t capacity) {
    const char *name = NULL;
    if (ap_driver.get_error_name == NULL || ap_driver.get_error_name(result, &name) != 0 ||
        name == NULL)
        name = "unknown CUDA error";
    snprintf(out, capacity, "%s, code %d", name, result);
}

static int ap_driver_bind(void) {
    void *h = ap_driver.handle;
    /* cuDeviceTotalMem_v2 is the 64-bit entry cuda.h maps cuDeviceTotalMem to. */
    struct {
        void **slot;
        const char *symbol;
    } table[] = {
        {(void **)&ap_driver.init, "cuInit"},
        {(void **)&ap_driver.device_get_count, "cuDeviceGetCount"},
        {(void **)&ap_driver.device_get, "cuDeviceGet"},
        {(void **)&ap_driver.device_get_attribute, "cuDeviceGetAttribute"},
        {(void **)&ap_driver.device_get_name, "cuDeviceGetName"},
        {(void **)&ap_driver.device_total_mem, "cuDeviceTotalMem_v2"},
        {(void **)&ap_driver.driver_get_version, "cuDriverGetVersion"},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        *table[i].slot = dlsym(h, table[i].symbol);
        if (*table[i].slot == NULL) {
            snprintf(ap_driver.failure, sizeof ap_driver.failure,
                     "CUDA driver libcuda.so.1 has no symbol %s", table[i].symbol);
            return 0;
        }
    }
    *(void **)&ap_driver.get_error_name = dlsym(h, "cuGetErrorName");
    return 1;
}

static void ap_driver_load(void) {
    ap_driver.handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (ap_driver.handle == NULL) {
        const char *why = dlerror();
        snprintf(ap_driver.failure, sizeof ap_driver.failure, "no CUDA driver: %s",
                 why != NULL ? why : "libcuda.so.1 could not be opened");
        return;
    }
    if (!ap_driver_bind()) return;
    int version = 0;
    if (ap_driver.driver_get_version(&version) == AP_CU_SUCCESS) ap_driver.driver_version = version;
    ap_cu_result result = ap_driver.init(0);
    if (result != AP_CU_SUCCESS) {
        char what[96];
        ap_driver_describe_error(result, what, sizeof what);
        snprintf(ap_driver.failure, sizeof ap_driver.failure,
                 "CUDA driver found but cuInit failed (%s)", what);
        return;
    }
    ap_log(AP_LOG_LOAD, "CUDA driver loaded, version %d", ap_driver.driver_version);
}

void ap_device_cpu(ap_device *out, const char *reason) {
    if (out == NULL) return;
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    out->ordinal = -1;
    snprintf(out->name, sizeof out->name, "cpu");
    snprintf(out->unusable_reason, sizeof out->unusable_reason, "%s", reason != NULL ? reason : "");
}

/* Fill the attributes of one device; on failure, the reason goes into `out` as the CPU. */
static ap_status ap_device_read(int32_t ordinal, ap_device *out) {
    ap_cu_device device = 0;
    ap_cu_result result = ap_driver.device_get(&device, ordinal);
    char what[96];
    if (result != AP_CU_SUCCESS) goto fail;
    struct {
        int attribute;
        int32_t *value;
    } attributes[] = {
        {AP_CU_ATTR_COMPUTE_CAPABILITY_MAJOR, &out->cc_major},
        {AP_CU_ATTR_COMPUTE_CAPABILITY_MINOR, &out->cc_minor},
        {AP_CU_ATTR_MULTIPROCESSOR_COUNT, &out->sm_count},
        {AP_CU_ATTR_L2_CACHE_SIZE, &out->l2_bytes},
        {AP_CU_ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, &out->smem_per_block_optin},
    };
    for (size_t i = 0; i < sizeof attributes / sizeof attributes[0]; i++) {
        int value = 0;
        result = ap_driver.device_get_attribute(&value, attributes[i].attribute, device);
        if (result != AP_CU_SUCCESS) goto fail;
        *attributes[i].value = value;
    }
    size_t bytes = 0;
    result = ap_driver.device_total_mem(&bytes, device);
    if (result != AP_CU_SUCCESS) goto fail;
    out->total_memory = (int64_t)bytes;
    result = ap_driver.device_get_name(out->name, (int)sizeof out->name, device);
    if (result != AP_CU_SUCCESS) goto fail;
    out->name[sizeof out->name - 1] = '\0';
    return AP_OK;
fail:
    ap_driver_describe_error(result, what, sizeof what);
    ap_device_cpu(out, NULL);
    snprintf(out->unusable_reason, sizeof out->unusable_reason,
             "CUDA device %d could not be read (%s)", (int)ordinal, what);
    return ap_error_set(AP_ERR_NO_DEVICE, "%s", out->unusable_reason);
}

ap_status ap_device_query(int32_t ordinal, ap_device *out) {
    if (out == NULL) return ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_device_query: out is NULL");
    pthread_once(&ap_driver_once, ap_driver_load);
    if (ap_driver.failure[0] != '\0') {
        ap_device_cpu(out, ap_driver.failure);
        out->driver_version = ap_driver.driver_version;
        ap_log(AP_LOG_SELECT, "device %d: %s", (int)ordinal, ap_driver.failure);
        return ap_error_set(AP_ERR_NO_DEVICE, "%s", ap_driver.failure);
    }
    int count = 0;
    ap_cu_result result = ap_driver.device_get_count(&count);
    if (result != AP_CU_SUCCESS) count = 0;
    if (ordinal < 0 || ordinal >= count) {
        ap_device_cpu(out, NULL);
        out->driver_version = ap_driver.driver_version;
        snprintf(out->unusable_reason, sizeof out->unusable_reason,
                 "no CUDA device %d (the driver sees %d)", (int)ordinal, count);
        return ap_error_set(AP_ERR_NO_DEVICE, "%s", out->unusable_reason);
    }
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    out->ordinal = ordinal;
    out->driver_version = ap_driver.driver_version;
    ap_status status = ap_device_read(ordinal, out);
    if (status != AP_OK) {
        out->driver_version = ap_driver.driver_version;
        return status;
    }
    ap_log(AP_LOG_SELECT, "device %d: %s, sm_%d%d, %d SMs, driver %d", (int)ordinal, out->name,
           (int)out->cc_major, (int)out->cc_minor, (int)out->sm_count, out->driver_version);
    return AP_OK;
}
