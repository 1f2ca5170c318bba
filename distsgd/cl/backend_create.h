/* distsgd/cl/backend_create.h - the OpenCL backend's creation: its queue, kernels and table, dsgd_cl_backend_create
   Part of distsgd's OpenCL add-on (see ../../distsgd_cl.h, which includes the parts in order).

   A part of backend.h (the backend's state, buffers, staging, finish and
   destroy) after backend_ops.h (the operations). Here: the phases of
   dsgd_cl_backend_create (the queue, the kernels, the status buffer), the
   table of operations it fills, and dsgd_cl_backend_create itself.
*/
#if defined(DISTSGD_CL_IMPLEMENTATION) && !defined(DSGD_CL__PART_BACKEND_CREATE_IMPL)
#define DSGD_CL__PART_BACKEND_CREATE_IMPL

/* >>backend creation -------------------------------------------------------- */
/* dsgd_cl_backend_create's phases, in order. Each records its error on ctx
   and leaves what it created in b, for dsgd_cl__destroy to release. */

/* The device's shared queue (see QUEUES) with one more reference, or a queue
   of the backend's own (always with profiling). */
static dsgd_result dsgd_cl__open_queue(dsgd_ctx *ctx, dsgd_cl__backend *b, int profiling) {
    dsgd_cl_context *c = b->cl;
    cl_command_queue shared = dsgd_cl__context_shared_queue(c, b->dev);
    cl_int err;
    if (shared && !profiling) {
        b->queue = shared;
        err = clRetainCommandQueue(b->queue);
    } else {
        b->queue = clCreateCommandQueue(dsgd_cl_context_handle(c), b->device,
                                        profiling ? CL_QUEUE_PROFILING_ENABLE : 0, &err);
    }
    if (err != CL_SUCCESS) {
        b->queue = NULL;
        return dsgd_cl__fail(ctx, err, "clCreateCommandQueue", dsgd_cl_context_device_info(c, b->dev)->device_name);
    }
    return DSGD_OK;
}

/* The backend's own kernel objects (clSetKernelArg is not thread-safe on a
   shared cl_kernel) and the work-group sizes it launches them with. */
static dsgd_result dsgd_cl__make_kernels(dsgd_ctx *ctx, dsgd_cl__backend *b) {
    const dsgd_cl_device_info *info = dsgd_cl_context_device_info(b->cl, b->dev);
    size_t kmax = (size_t)-1, local_mem = (size_t)info->local_mem_bytes;
    cl_int err;
    int k;
    for (k = 0; k < DSGD_CL__K_COUNT; ++k) {
        size_t wg = 0;
        b->kernels[k] = clCreateKernel(dsgd_cl__context_program(b->cl), dsgd_cl__kernel_fn[k], &err);
        if (err != CL_SUCCESS) {
            b->kernels[k] = NULL;
            return dsgd_cl__fail(ctx, err, "clCreateKernel", dsgd_cl__kernel_fn[k]);
        }
        err = clGetKernelWorkGroupInfo(b->kernels[k], b->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof(wg), &wg, NULL);
        if (err != CL_SUCCESS) return dsgd_cl__fail(ctx, err, "clGetKernelWorkGroupInfo", dsgd_cl__kernel_fn[k]);
        if (wg < kmax) kmax = wg;
    }
    /* Work-groups are one-dimensional but for the image and bias_backward
       kernels' (lx, ly), whose lx ly is at most b->local: the device's limits
       (work-group and first dimension; a driver may report a kernel limit
       above them, or POCL_MAX_WORK_GROUP_SIZE lowers them) cap the kernels'
       answers. */
    if (info->max_work_group_size && info->max_work_group_size < kmax) kmax = info->max_work_group_size;
    if (info->max_work_item_sizes[0] && info->max_work_item_sizes[0] < kmax) kmax = info->max_work_item_sizes[0];
    /* One work-group size for every element-wise kernel keeps the number of
       compiled variants (PoCL compiles one per size) small. */
    b->local = kmax < 256 ? kmax : 256;
    if (b->local < 1) b->local = 1;
    /* The image and bias_backward kernels' two-dimensional ranges. */
    b->local_max1 = info->max_work_item_sizes[1] ? info->max_work_item_sizes[1] : 1;
    {
        /* DSGD_CL_IMAGE_INDEX_BITS=64 forces the 64-bit image kernels (for
           the tests: no test buffer is large enough to need them); */
        const char *bits = getenv("DSGD_CL_IMAGE_INDEX_BITS"), *spread = getenv("DSGD_CL_IMAGE_SPREAD");
        b->img32_max = bits && strcmp(bits, "64") == 0 ? 0 : 0x7fffffff;
        /* the same for DSGD_CL_IMAGE_SPREAD=1 or 0, which sets img_spread */
        b->img_spread = spread && *spread ? strcmp(spread, "0") != 0 : info->type != DSGD_CL_DEVICE_CPU;
        /* and DSGD_CL_GEMM_SPLIT_K=1 or 0 for split_k */
        spread = getenv("DSGD_CL_GEMM_SPLIT_K");
        b->split_k = spread && *spread ? strcmp(spread, "0") != 0 : info->type != DSGD_CL_DEVICE_CPU;
    }
    /* Reductions: the largest power of two that fits, at most 256, and whose
       local arrays fit in local memory. */
    b->reduce_local = 1;
    while (b->reduce_local * 2 <= b->local &&
           b->reduce_local * 2 * (2 * b->acc_size + 2 * sizeof(cl_ulong)) <= local_mem)
        b->reduce_local *= 2;
    return DSGD_OK;
}

/* The small buffer of int / ulong results (loss status, norm counts). */
static dsgd_result dsgd_cl__make_status(dsgd_ctx *ctx, dsgd_cl__backend *b) {
    cl_int err;
    b->status = clCreateBuffer(dsgd_cl_context_handle(b->cl), CL_MEM_READ_WRITE, DSGD_CL__STATUS_BYTES, NULL, &err);
    if (err != CL_SUCCESS) {
        b->status = NULL;
        return dsgd_cl__fail(ctx, err, "clCreateBuffer", "status");
    }
    {
        void *host;
        dsgd_result r = dsgd_cl__pinned(b, DSGD_CL__CHECKS_MAX * 4 * sizeof(cl_int), CL_MAP_READ, "loss class checks",
                                        &b->checks_mem, &host);
        b->checks_host = (cl_int *)host;
        return r;
    }
}

/* Every member of dsgd_backend_i, the optional ones included. */
static void dsgd_cl__fill_interface(dsgd_backend_i *out, dsgd_cl__backend *b) {
    out->name = "opencl";
    out->impl = b;
    out->destroy = dsgd_cl__destroy;
    out->buffer_create = dsgd_cl__buffer_create;
    out->buffer_destroy = dsgd_cl__buffer_destroy;
    out->buffer_host_ptr = dsgd_cl__buffer_host_ptr;
    out->write = dsgd_cl__write;
    out->read = dsgd_cl__read;
    out->copy = dsgd_cl__copy;
    out->fill = dsgd_cl__fill;
    out->scale = dsgd_cl__scale;
    out->axpy = dsgd_cl__axpy;
    out->gemm = dsgd_cl__gemm;
    out->bias_act_forward = dsgd_cl__bias_act_forward;
    out->act_backward = dsgd_cl__act_backward;
    out->bias_backward = dsgd_cl__bias_backward;
    out->loss = dsgd_cl__loss;
    out->optimizer_update = dsgd_cl__optimizer_update;
    out->norm_check = dsgd_cl__norm_check;
    out->finish = dsgd_cl__finish;
    out->map = dsgd_cl__map_rw;
    out->unmap = dsgd_cl__unmap_rw;
    out->host_shared = dsgd_cl__host_shared;
    out->can_access = dsgd_cl__can_access;
    out->sum_across = dsgd_cl__sum_across;
    out->im2col = dsgd_cl__im2col;
    out->col2im = dsgd_cl__col2im;
    out->maxpool_forward = dsgd_cl__maxpool_forward;
    out->maxpool_backward = dsgd_cl__maxpool_backward;
    out->device_name = dsgd_cl__device_name;
    out->mark = dsgd_cl__mark;
    out->wait_marks = dsgd_cl__wait_marks;
    out->release_mark = dsgd_cl__release_mark;
    out->nonfinite_flag = dsgd_cl__nonfinite_flag;
    out->read_marked = dsgd_cl__read_marked;
    out->wait_mark = dsgd_cl__wait_mark;
}

DSGD_API dsgd_result dsgd_cl_backend_create(dsgd_ctx *ctx, dsgd_cl_context *c, const dsgd_cl_backend_desc *desc,
                                            dsgd_backend_i *out) {
    dsgd_cl_backend_desc d;
    dsgd_cl__backend *b;
    dsgd_result r;
    if (!out || !c)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_cl_backend_create: %s is NULL",
                                  out ? "the context" : "out");
    memset(out, 0, sizeof(*out));
    memset(&d, 0, sizeof(d));
    if (desc) d = *desc;
    if (d.device < 0 || d.device >= dsgd_cl_context_num_devices(c))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_cl_backend_create: device %d outside the context's 0..%d (use replica %% "
                                  "dsgd_cl_context_num_devices())",
                                  d.device, dsgd_cl_context_num_devices(c) - 1);
    b = (dsgd_cl__backend *)DSGD_MALLOC(sizeof(*b));
    if (!b) return dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "dsgd_cl_backend_create");
    memset(b, 0, sizeof(*b));
    b->ctx = ctx;
    b->cl = c;
    b->dev = d.device;
    b->device = dsgd_cl_context_device(c, d.device);
    b->acc_size = dsgd_cl_context_fp64(c) ? sizeof(cl_double) : sizeof(cl_float);
    snprintf(b->label, sizeof(b->label), "%s (device %d of its context)",
             dsgd_cl_context_device_info(c, d.device)->device_name, d.device);
    if (d.host_visible > 0 || (d.host_visible == 0 && dsgd_cl_context_device_info(c, d.device)->unified_memory))
        b->alloc_flags = CL_MEM_ALLOC_HOST_PTR;
    r = dsgd_cl__open_queue(ctx, b, d.profiling);
    if (r == DSGD_OK) r = dsgd_cl__make_kernels(ctx, b);
    if (r == DSGD_OK) r = dsgd_cl__make_status(ctx, b);
    if (r != DSGD_OK) {
        dsgd_cl__destroy(b);
        return r;
    }
    dsgd_cl__fill_interface(out, b);
    return DSGD_OK;
}

#endif /* DSGD_CL__PART_BACKEND_CREATE_IMPL */
