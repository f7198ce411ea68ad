/*
 * energy.c - the GPU's energy counter for `sparsek run`: NVML's total
 * energy (millijoules since the driver loaded), read on the host before the
 * first metered call is queued and after the last one has finished
 * (run.c meter_energy: >= 2 s of calls after the timed ones). NVML is
 * opened with dlopen, so the CLI builds without it and runs where it is
 * missing (energy then reads as unknown).
 *
 * The window also holds the few microseconds between the first read and
 * the first kernel, and the counter advances in steps (about every 10-100
 * ms depending on the GPU): over a window of two seconds the figure is
 * good to a few per cent, which is what comparing variants needs (issue 28:
 * joules per call beside time).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

#ifndef SK_NO_CUDA

/* NVML's C types as its header declares them: nvmlReturn_t is an int enum
 * (0 = success), nvmlDevice_t an opaque pointer. */
typedef int (*nvml_init_fn)(void);
typedef int (*nvml_handle_fn)(const char *pci_bus_id, void **device);
typedef int (*nvml_energy_fn)(void *device, unsigned long long *millijoules);

/* dlsym's object pointer as a function pointer of the right type (ISO C has
 * no cast between the two; POSIX guarantees the representation). */
static void symbol(void *lib, const char *name, void *fn_out, size_t fn_size) {
    void *sym = dlsym(lib, name);
    memset(fn_out, 0, fn_size);
    if (sym != NULL) memcpy(fn_out, &sym, fn_size);
}

int energy_open(gpu_energy *e, int cuda_device) {
    memset(e, 0, sizeof *e);
    char bus[32];
    if (cudaDeviceGetPCIBusId(bus, (int)sizeof bus, cuda_device) != cudaSuccess) return -1;
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) return -1;
    nvml_init_fn init;
    nvml_handle_fn handle;
    nvml_energy_fn energy;
    symbol(lib, "nvmlInit_v2", &init, sizeof init);
    symbol(lib, "nvmlDeviceGetHandleByPciBusId_v2", &handle, sizeof handle);
    symbol(lib, "nvmlDeviceGetTotalEnergyConsumption", &energy, sizeof energy);
    unsigned long long probe = 0;
    if (init == NULL || handle == NULL || energy == NULL || init() != 0 ||
        handle(bus, &e->device) != 0 || energy(e->device, &probe) != 0) {
        dlclose(lib);
        memset(e, 0, sizeof *e);
        return -1;
    }
    e->lib = lib;
    e->read = energy;
    return 0;
}

int energy_read_mj(const gpu_energy *e, unsigned long long *millijoules) {
    if (e->lib == NULL) return -1;
    return e->read(e->device, millijoules) == 0 ? 0 : -1;
}

void energy_close(gpu_energy *e) {
    /* NVML stays initialised (nvmlShutdown is reference counted and the
     * process ends soon); the library handle is released. */
    if (e->lib != NULL) dlclose(e->lib);
    memset(e, 0, sizeof *e);
}

#endif /* SK_NO_CUDA */
