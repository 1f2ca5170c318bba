#!/usr/bin/env python3
"""bench/cnn_torch.py - the CNN of bench/cnn.c (examples/cnn_fashion_mnist.c)
in PyTorch on the CPU: the step time, for bench/cnn.sh's table.

Same shapes, NCHW (PyTorch's layout; distsgd's is NHWC, which does not
change the work): 28x28x1 -> conv 3x3 pad 1 x16 relu -> max-pool 2 -> conv
3x3 pad 1 x32 relu -> max-pool 2 -> flatten -> dense 128 relu -> dense 10;
softmax cross-entropy (the batch mean, as distsgd's grad scale 1/B); SGD with
momentum 0.9, lr 0.01; batch 64 of random data (a step-time bench: the
values do not matter). A step is zero_grad + forward + backward + step, as
distsgd's dsgd_model_compute_gradients + dsgd_optimizer_step.

For each thread setting (--threads, default "1 CORES"; torch.set_num_threads,
one interop thread): `--warmup` untimed steps, then `--rounds` rounds of
`--steps` steps, the settings interleaved round by round; the median per
step. Ends with one line:
  RESULT torch_cnn batch=64 torch=VERSION t1_ms=.. t1_samples_per_s=.. tN_ms=.. ...

CUDA stubs: with PEERS_CUDA_STUBS set (bench/peers.sh's install of a
CUDA wheel), importing bench/peers_torch.py loads the stand-ins first.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers_torch  # noqa: E402,F401  (loads the CUDA stand-ins, if any, before torch)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default=None, help="thread settings, e.g. '1 2' (default: 1 and the cores)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    settings = [int(t) for t in (args.threads or "1 %d" % cores).split()]
    settings = sorted(set(t for t in settings if t >= 1))
    if not settings or args.rounds < 1 or args.steps < 1 or args.batch < 1:
        raise SystemExit("cnn_torch.py: threads, rounds, steps and batch must be positive")

    import torch
    nn = torch.nn
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.manual_seed(7)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(7 * 7 * 32, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.rand(args.batch, 1, 28, 28)
    y = torch.randint(0, 10, (args.batch,))
    params = sum(p.numel() for p in model.parameters())

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    print("torch %s, %d parameters, batch %d, mkldnn %s; thread settings %s, %d rounds of %d steps after %d warm-up"
          " steps" % (torch.__version__, params, args.batch, torch.backends.mkldnn.is_available(), settings,
                      args.rounds, args.steps, args.warmup), flush=True)
    times = {t: [] for t in settings}
    for t in settings:
        torch.set_num_threads(t)
        for _ in range(args.warmup):
            step()
    for r in range(args.rounds):
        for t in (settings if r % 2 == 0 else settings[::-1]):
            torch.set_num_threads(t)
            step()  # one untimed step after switching
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            times[t].append((time.perf_counter() - t0) / args.steps)
    fields = ["RESULT torch_cnn batch=%d torch=%s" % (args.batch, torch.__version__)]
    for t in settings:
        med = statistics.median(times[t])
        print("  threads %d: %.3f ms/step, %.0f samples/s (rounds: %s)"
              % (t, 1e3 * med, args.batch / med, " ".join("%.2f" % (1e3 * v) for v in times[t])))
        fields.append("t%d_ms=%.4f t%d_samples_per_s=%.1f" % (t, 1e3 * med, t, args.batch / med))
    print(" ".join(fields), flush=True)


if __name__ == "__main__":
    main()
