#!/usr/bin/env python3
"""bench/peers_torch.py - the `make demo` MLP (examples/mirrored_mlp.c) in PyTorch
on the CPU, for bench/peers.sh's side-by-side table.

Same task as the demo: Fashion-MNIST from the uncompressed IDX files, pixels
scaled by 1/255 in float32 as dsgd_dataset_load_idx does; an MLP 784-H1-H2-10
with ReLU (He normal kernels before a ReLU, Glorot uniform for the last layer,
zero biases, as DSGD_INIT_AUTO); softmax cross-entropy; SGD with momentum 0.9
and Nesterov; lr = base_lr * global_batch / 128 (Goyal et al. 2017) with a
linear warmup from 0 over half an epoch, then cosine to 0 at the end of
training, the formula of dsgd_lr_at; a new shuffle every epoch, the last
partial batch dropped (dsgd_sampler with drop_last).

  --procs 1 --threads T   one process, torch.set_num_threads(T)
  --procs N --threads T   N processes (torch.multiprocessing, spawn) on this
                          host, DistributedDataParallel over gloo; each takes
                          its contiguous 1/N of every global batch (as
                          distsgd's replicas do) and uses T threads

The run ends with one line:
  RESULT torch procs=N threads=T hidden=H1,H2 global_batch=B steps=S
         samples_per_s=X test_acc=Y ...
samples_per_s counts the training steps after the first --warmup-steps
(default 5) only: no start-up, no data loading, no evaluation. test_acc is
measured on the 10,000 test images after training.

CUDA stubs. PyPI's Linux x86-64 torch wheel is the CUDA build: its libraries
are linked against libcudart, cuBLAS, cuDNN, NCCL, ... which come in multi-GB
nvidia-* wheels. For a CPU run none of them is ever called, so bench/peers.sh
installs the wheel without those dependencies and gives it empty stand-ins:
`peers_torch.py --make-cuda-stubs DIR` compiles, for every CUDA library that
torch's libraries name, a small shared library with that soname, the symbol
versions they ask for and one function per symbol they import (each returns
100, cudaErrorNoDevice, so torch.cuda.is_available() is False). With
PEERS_CUDA_STUBS=DIR in the environment this script loads them before torch,
so the dynamic linker takes them for the real ones. A CPU-only torch (or one
with its CUDA libraries installed) needs nothing of this.
"""
import argparse
import math
import os
import re
import socket
import subprocess
import sys
import time


def _preload_cuda_stubs():
    """Loads the stand-in CUDA libraries of PEERS_CUDA_STUBS, if set, before
    torch is imported (in this process and in the spawned workers, which run
    this module's top level again)."""
    d = os.environ.get("PEERS_CUDA_STUBS")
    if not d:
        return
    import ctypes
    for name in sorted(os.listdir(d)):
        if re.search(r"\.so(\.[0-9]+)*$", name):
            ctypes.CDLL(os.path.join(d, name), mode=ctypes.RTLD_GLOBAL)


_preload_cuda_stubs()


# ---------------------------------------------------------------- data

def read_idx(path, ndim):
    """The array of an IDX file of unsigned bytes (type 0x08) with ndim
    dimensions, as (shape, bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 4 + 4 * ndim or data[0] != 0 or data[1] != 0 or data[2] != 0x08 or data[3] != ndim:
        raise SystemExit("%s: not an IDX file of %d-dimensional unsigned bytes" % (path, ndim))
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    body = data[4 + 4 * ndim:]
    count = 1
    for s in shape:
        count *= s
    if len(body) != count:
        raise SystemExit("%s: %d bytes of data, the header says %d" % (path, len(body), count))
    return shape, body


def load_split(torch, data_dir, prefix):
    ishape, ibytes = read_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte"), 3)
    lshape, lbytes = read_idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte"), 1)
    if ishape[0] != lshape[0]:
        raise SystemExit("%s: %d images but %d labels" % (prefix, ishape[0], lshape[0]))
    n, dim = ishape[0], ishape[1] * ishape[2]
    px = torch.frombuffer(bytearray(ibytes), dtype=torch.uint8).reshape(n, dim)
    # (float)px * (1.0f / 255.0f) in float32, as dsgd_dataset_load_idx
    x = px.to(torch.float32) * torch.tensor(1.0 / 255.0, dtype=torch.float32)
    y = torch.frombuffer(bytearray(lbytes), dtype=torch.uint8).to(torch.int64)
    return x.contiguous(), y


# ---------------------------------------------------------------- model

def make_model(torch, hidden, seed):
    nn = torch.nn
    torch.manual_seed(seed)
    dims = [784] + list(hidden) + [10]
    layers = []
    for i in range(len(dims) - 1):
        lin = nn.Linear(dims[i], dims[i + 1])
        last = i == len(dims) - 2
        with torch.no_grad():
            if last:  # Glorot uniform: U(-a, a), a = sqrt(6 / (fan_in + fan_out))
                a = math.sqrt(6.0 / (dims[i] + dims[i + 1]))
                lin.weight.uniform_(-a, a)
            else:  # He normal: N(0, 2 / fan_in)
                lin.weight.normal_(0.0, math.sqrt(2.0 / dims[i]))
            lin.bias.zero_()
        layers.append(lin)
        if not last:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def lr_at(t, peak, warmup, total):
    """dsgd_lr_at for a COSINE schedule with warmup_start_lr = final_lr = 0."""
    if t < warmup:
        return peak * t / warmup
    span = total - warmup
    u = t - warmup
    if span <= 0 or u >= span:
        return 0.0
    return peak * 0.5 * (1.0 + math.cos(math.pi * u / span))


# ---------------------------------------------------------------- training

def train(rank, args, port):
    """One process's training (rank 0 of 1 without DDP). Rank 0 prints the
    RESULT line."""
    import torch
    procs = args.procs
    if procs > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    import torch.distributed as dist
    if procs > 1:
        dist.init_process_group("gloo", rank=rank, world_size=procs)

    train_x, train_y = load_split(torch, args.data, "train")
    test_x, test_y = load_split(torch, args.data, "t10k")
    gb = args.global_batch
    local = gb // procs
    nb = train_x.shape[0] // gb  # batches per epoch, last partial one dropped
    total = max(1, int(round(args.epochs * nb)))  # the schedule's length
    steps = total if args.steps is None else min(args.steps, total)
    warmup = nb // 2
    peak = args.base_lr * gb / 128.0

    model = make_model(torch, args.hidden, args.seed)
    net = model
    if procs > 1:
        from torch.nn.parallel import DistributedDataParallel
        net = DistributedDataParallel(model)
    opt = torch.optim.SGD(net.parameters(), lr=peak, momentum=0.9, nesterov=True)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(args.seed)  # the same order on every rank
    lo, hi = rank * local, (rank + 1) * local

    skip = min(args.warmup_steps, max(steps - 1, 0))
    t_start = t_measure = time.perf_counter()
    order = None
    last_loss = 0.0
    for t in range(steps):
        if t == skip:
            t_measure = time.perf_counter()
        b = t % nb
        if b == 0:
            gen.manual_seed(args.seed * 1000003 + t // nb)
            order = torch.randperm(train_x.shape[0], generator=gen)
        idx = order[b * gb + lo:b * gb + hi]
        xb = train_x.index_select(0, idx)
        yb = train_y.index_select(0, idx)
        for g in opt.param_groups:
            g["lr"] = lr_at(t, peak, warmup, total)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(xb), yb)
        loss.backward()
        opt.step()
        if t == steps - 1:
            last_loss = loss.item()
    t_end = time.perf_counter()
    measured = steps - skip

    correct, loss_sum = 0, 0.0
    if rank == 0:
        model.eval()
        with torch.no_grad():
            for i in range(0, test_x.shape[0], 1000):
                out = model(test_x[i:i + 1000])
                loss_sum += torch.nn.functional.cross_entropy(out, test_y[i:i + 1000], reduction="sum").item()
                correct += (out.argmax(1) == test_y[i:i + 1000]).sum().item()
    if procs > 1:
        dist.barrier()
        dist.destroy_process_group()
    if rank != 0:
        return
    n_test = test_x.shape[0]
    sps = measured * gb / (t_end - t_measure) if measured > 0 and t_end > t_measure else float("nan")
    print("torch %s, %d process%s x %d thread%s, model 784-%s-10, global batch %d (%d per process), "
          "%d steps (%.3g epochs of %d batches; schedule %d steps, warmup %d), lr %.4g"
          % (torch.__version__, procs, "" if procs == 1 else "es", args.threads,
             "" if args.threads == 1 else "s", "-".join(map(str, args.hidden)), gb, local, steps,
             steps / nb, nb, total, warmup, peak))
    print("RESULT torch procs=%d threads=%d hidden=%s global_batch=%d steps=%d measured_steps=%d "
          "samples_per_s=%.1f test_acc=%.4f test_loss=%.4f last_loss=%.4f train_s=%.2f"
          % (procs, args.threads, ",".join(map(str, args.hidden)), gb, steps, measured, sps,
             correct / n_test, loss_sum / n_test, last_loss, t_end - t_start))
    sys.stdout.flush()


# ---------------------------------------------------------------- CUDA stubs

_SYSTEM_LIB_DIRS = ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"]
# What a stand-in may replace: CUDA's libraries (cudart, cuBLAS, cuDNN, cuFFT,
# cuFile, cuSPARSE(Lt), cuSOLVER, CUPTI, cuRAND, NVRTC, nvJitLink, NVTX,
# NVSHMEM, NCCL and the driver's libcuda).
_CUDA_NAME = re.compile(r"^lib(cu|nv|nccl)[A-Za-z_]*\.so")


def _run(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def _find_system_lib(soname):
    for d in _SYSTEM_LIB_DIRS:
        p = os.path.join(d, soname)
        if os.path.exists(p):
            return p
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    m = re.search(r"^\s*" + re.escape(soname) + r" \(.*x86-64.*\) => (\S+)$", out, re.M)
    return m.group(1) if m else None


def make_cuda_stubs(out_dir, cc="cc"):
    """Builds out_dir/<soname> for every CUDA library torch's shared objects
    need; returns the sonames."""
    import importlib.util
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("--make-cuda-stubs: torch is not installed in this Python")
    root = list(spec.submodule_search_locations)[0]
    elfs = []
    for d, _, files in os.walk(root):
        elfs += [os.path.join(d, f) for f in files if re.search(r"\.so(\.|$)", f)]
    own, needed, undef, defined, verfile = set(), {}, {}, set(), {}
    for p in elfs:
        own.add(os.path.basename(p))
        dyn = _run(["readelf", "-d", "-W", p])
        needed[p] = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)
        own.update(re.findall(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", dyn))
        # version needs: which library each version name belongs to
        cur = None
        for line in _run(["readelf", "-V", "-W", p]).splitlines():
            m = re.search(r"File: (\S+)\s+Cnt:", line)
            if m:
                cur = m.group(1)
                continue
            m = re.search(r"Name: (\S+)\s+Flags:", line)
            if m and cur:
                verfile[m.group(1)] = cur
        for line in _run(["nm", "-D", p]).splitlines():
            f = line.split()
            if len(f) == 2 and f[0] == "U":
                undef.setdefault(p, set()).add(f[1])
            elif len(f) == 3 and f[1] not in ("U", "w", "v"):
                defined.add(f[2].split("@")[0])
    missing = sorted({n for ns in needed.values() for n in ns if n not in own})
    stubs = [n for n in missing if _CUDA_NAME.match(n)]
    # whatever else is missing is expected from the system: its symbols are
    # not the stubs' to define
    for n in missing:
        if n in stubs:
            continue
        path = _find_system_lib(n)
        if path is None:
            raise SystemExit("--make-cuda-stubs: torch needs %s, which is neither CUDA nor found on this system" % n)
        for line in _run(["nm", "-D", "--defined-only", path]).splitlines():
            f = line.split()
            if len(f) == 3:
                defined.add(f[2].split("@")[0])
    syms = {s: {} for s in stubs}  # soname -> {symbol: version or None}
    for p, us in undef.items():
        deps = [n for n in needed[p] if n in syms]
        for u in us:
            name, _, ver = u.partition("@")
            ver = ver.lstrip("@")
            if ver:
                lib = verfile.get(ver)
                if lib in syms:
                    syms[lib].setdefault(name, ver)
            elif name not in defined:
                for lib in deps:  # unversioned: the stand-ins this object loads define it
                    syms[lib].setdefault(name, None)
    src_dir = os.path.join(out_dir, "src")
    os.makedirs(src_dir, exist_ok=True)
    strings = re.compile(r"(ErrorString|ErrorName|StatusString|StatusName|GetLastErrorString)$")
    for lib in stubs:
        c_path = os.path.join(src_dir, lib + ".c")
        map_path = os.path.join(src_dir, lib + ".map")
        with open(c_path, "w") as f:
            f.write("/* stand-in for %s generated by bench/peers_torch.py --make-cuda-stubs */\n" % lib)
            for name in sorted(syms[lib]):
                if strings.search(name):
                    f.write('const char *%s(void) { return "CUDA is not installed (stand-in library)"; }\n' % name)
                else:
                    f.write("long %s(void) { return 100; }\n" % name)
        versions = sorted({v for v in syms[lib].values() if v})
        cmd = [cc, "-shared", "-fPIC", "-O0", "-w", "-o", os.path.join(out_dir, lib), "-Wl,-soname," + lib, c_path]
        if versions:
            with open(map_path, "w") as f:
                for i, v in enumerate(versions):
                    names = sorted(n for n, vv in syms[lib].items() if vv == v or (i == 0 and vv is None))
                    f.write("%s {\n  global:\n%s" % (v, "".join("    %s;\n" % n for n in names)))
                    f.write("  local: *;\n};\n" if i == 0 else "};\n")
            cmd.append("-Wl,--version-script=" + map_path)
        subprocess.run(cmd, check=True)
    return stubs


# ---------------------------------------------------------------- main

def parse_hidden(s):
    parts = s.split(",")
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        sizes = []
    if len(sizes) != 2 or min(sizes) < 1:
        raise argparse.ArgumentTypeError("--hidden takes two positive integers H1,H2, not %r" % s)
    return sizes


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="build/data/fashion-mnist", help="directory of the uncompressed IDX files")
    ap.add_argument("--procs", type=int, default=1, help="processes (DistributedDataParallel over gloo when > 1)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--hidden", type=parse_hidden, default=[256, 128], help="hidden sizes H1,H2 (default 256,128)")
    ap.add_argument("--epochs", type=float, default=1.0, help="epochs, fractions allowed (default 1)")
    ap.add_argument("--steps", type=int, default=None, help="stop after this many steps (the schedule still "
                    "spans --epochs)")
    ap.add_argument("--global-batch", type=int, default=256, help="global batch (default 256)")
    ap.add_argument("--base-lr", type=float, default=0.05, help="lr at batch 128 (default 0.05)")
    ap.add_argument("--warmup-steps", type=int, default=5, help="steps left out of samples/s (default 5)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--make-cuda-stubs", metavar="DIR", help="build the stand-in CUDA libraries in DIR and exit")
    args = ap.parse_args()
    if args.make_cuda_stubs:
        libs = make_cuda_stubs(args.make_cuda_stubs, os.environ.get("CC", "cc"))
        print("stand-ins for %d CUDA libraries in %s: %s" % (len(libs), args.make_cuda_stubs, " ".join(libs)))
        return
    if args.procs < 1 or args.threads < 1 or args.epochs <= 0 or (args.steps is not None and args.steps < 1):
        ap.error("--procs, --threads and --steps must be >= 1, --epochs > 0")
    if args.global_batch < args.procs or args.global_batch % args.procs:
        ap.error("--global-batch %d does not split evenly over %d processes" % (args.global_batch, args.procs))
    if args.procs == 1:
        train(0, args, 0)
    else:
        import torch.multiprocessing as mp
        mp.spawn(train, args=(args, free_port()), nprocs=args.procs, join=True)


if __name__ == "__main__":
    main()
