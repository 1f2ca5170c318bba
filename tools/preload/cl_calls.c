/* tools/preload/cl_calls.c - counts a program's OpenCL calls that make the
   host wait for a device, and its kernel launches, independently of the
   library's own count (dsgd_cl_backend_host_waits). Developer code.

   Build and use (make tools builds it too):
     cc -O2 -shared -fPIC tools/preload/cl_calls.c -o build/tools/cl_calls.so -ldl
     LD_PRELOAD=$PWD/build/tools/cl_calls.so build/bench/train_cl 3 10
   At exit it prints to stderr one line:
     cl_calls: finish=.. wait_events=.. blocking_reads=.. blocking_writes=..
               blocking_maps=.. waits=.. (their sum) launches=.. set_arg=..
               reads=.. writes=..
   Per step: run twice with different step counts and divide the
   difference by the difference in steps. CLBlast's own calls count too
   (they go through the same OpenCL entry points). */
#define _GNU_SOURCE
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <dlfcn.h>
#include <stdio.h>

static unsigned long n_finish, n_wait, n_bread, n_bwrite, n_bmap, n_launch, n_arg, n_read, n_write;

#define NEXT(name) ((name##_fn)dlsym(RTLD_NEXT, #name))

typedef cl_int (*clFinish_fn)(cl_command_queue);
cl_int clFinish(cl_command_queue q) {
    __atomic_add_fetch(&n_finish, 1, __ATOMIC_RELAXED);
    return NEXT(clFinish)(q);
}

typedef cl_int (*clWaitForEvents_fn)(cl_uint, const cl_event *);
cl_int clWaitForEvents(cl_uint n, const cl_event *e) {
    __atomic_add_fetch(&n_wait, 1, __ATOMIC_RELAXED);
    return NEXT(clWaitForEvents)(n, e);
}

typedef cl_int (*clEnqueueReadBuffer_fn)(cl_command_queue, cl_mem, cl_bool, size_t, size_t, void *, cl_uint,
                                         const cl_event *, cl_event *);
cl_int clEnqueueReadBuffer(cl_command_queue q, cl_mem m, cl_bool blocking, size_t off, size_t size, void *p,
                           cl_uint n, const cl_event *w, cl_event *e) {
    __atomic_add_fetch(blocking ? &n_bread : &n_read, 1, __ATOMIC_RELAXED);
    return NEXT(clEnqueueReadBuffer)(q, m, blocking, off, size, p, n, w, e);
}

typedef cl_int (*clEnqueueWriteBuffer_fn)(cl_command_queue, cl_mem, cl_bool, size_t, size_t, const void *, cl_uint,
                                          const cl_event *, cl_event *);
cl_int clEnqueueWriteBuffer(cl_command_queue q, cl_mem m, cl_bool blocking, size_t off, size_t size, const void *p,
                            cl_uint n, const cl_event *w, cl_event *e) {
    __atomic_add_fetch(blocking ? &n_bwrite : &n_write, 1, __ATOMIC_RELAXED);
    return NEXT(clEnqueueWriteBuffer)(q, m, blocking, off, size, p, n, w, e);
}

typedef void *(*clEnqueueMapBuffer_fn)(cl_command_queue, cl_mem, cl_bool, cl_map_flags, size_t, size_t, cl_uint,
                                       const cl_event *, cl_event *, cl_int *);
void *clEnqueueMapBuffer(cl_command_queue q, cl_mem m, cl_bool blocking, cl_map_flags f, size_t off, size_t size,
                         cl_uint n, const cl_event *w, cl_event *e, cl_int *err) {
    if (blocking) __atomic_add_fetch(&n_bmap, 1, __ATOMIC_RELAXED);
    return NEXT(clEnqueueMapBuffer)(q, m, blocking, f, off, size, n, w, e, err);
}

typedef cl_int (*clEnqueueNDRangeKernel_fn)(cl_command_queue, cl_kernel, cl_uint, const size_t *, const size_t *,
                                            const size_t *, cl_uint, const cl_event *, cl_event *);
cl_int clEnqueueNDRangeKernel(cl_command_queue q, cl_kernel k, cl_uint dim, const size_t *off, const size_t *g,
                              const size_t *l, cl_uint n, const cl_event *w, cl_event *e) {
    __atomic_add_fetch(&n_launch, 1, __ATOMIC_RELAXED);
    return NEXT(clEnqueueNDRangeKernel)(q, k, dim, off, g, l, n, w, e);
}

typedef cl_int (*clSetKernelArg_fn)(cl_kernel, cl_uint, size_t, const void *);
cl_int clSetKernelArg(cl_kernel k, cl_uint i, size_t size, const void *v) {
    __atomic_add_fetch(&n_arg, 1, __ATOMIC_RELAXED);
    return NEXT(clSetKernelArg)(k, i, size, v);
}

__attribute__((destructor)) static void report(void) {
    fprintf(stderr,
            "cl_calls: finish=%lu wait_events=%lu blocking_reads=%lu blocking_writes=%lu blocking_maps=%lu "
            "waits=%lu launches=%lu set_arg=%lu reads=%lu writes=%lu\n",
            n_finish, n_wait, n_bread, n_bwrite, n_bmap, n_finish + n_wait + n_bread + n_bwrite + n_bmap, n_launch,
            n_arg, n_read, n_write);
}
