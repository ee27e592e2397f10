"""Time msprobe 8.1.2's grad_probe on the gradient-probe workload (baseline for rlprobe).

Run with the msprobe venv's interpreter (see benchmarks/setup_msprobe_venv.sh):

    .venv-msprobe/bin/python benchmarks/msprobe_grad_workload.py --dump /tmp/msprobe_grad
    .venv-msprobe/bin/python benchmarks/msprobe_grad_workload.py --mode plain     # no monitoring
    .venv-msprobe/bin/python benchmarks/msprobe_grad_workload.py --mode compare A B OUT

Workload (identical to benchmarks/grad_overhead.py, which imports make_workload from here):
nn.Sequential of 6 Linear(1024, 1024) with ReLU between, AdamW(lr), batch 256, MSE loss
against a fixed random target; 4 input batches cycled. torch.manual_seed(seed) before
building the model, then the data. One step = zero_grad, forward, backward, optimizer.step.

Prints one JSON line:
  mode, step_s: per-step wall times of the measured steps (after --warmup steps),
  total_s: wall time of the measured steps, bytes_on_disk / sign_bytes / sign_files under --dump.
With --mode compare: {"mode": "compare", "call_s": time of GradComparator.compare_distributed}.
"""
import argparse
import json
import os
import sys
import time

LAYERS, WIDTH, BATCH, N_BATCHES = 6, 1024, 256, 4


def make_workload(seed, lr, torch, blocks=None, layers=None):
    """The default model; with blocks=(n, width, hidden, batch) n blocks of
    Linear(width, hidden) -> GELU -> Linear(hidden, width) (the GPU workload's shape is
    (16, 2048, 8192, 8192); a few of its blocks and a small batch fit a CPU); with
    layers=(n, hidden, batch) the parameters of an n-layer decoder (transformer_shaped)."""
    torch.manual_seed(seed)
    if layers is not None:
        n, hidden, batch = layers
        model = transformer_shaped(torch, n, hidden)
        return _training(torch, model, lr, hidden, batch)
    layers = []
    width, batch = WIDTH, BATCH
    if blocks is None:
        for i in range(LAYERS):
            layers.append(torch.nn.Linear(WIDTH, WIDTH))
            if i < LAYERS - 1:
                layers.append(torch.nn.ReLU())
    else:
        n, width, hidden, batch = blocks
        for _ in range(n):
            layers += [torch.nn.Linear(width, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, width)]
    return _training(torch, torch.nn.Sequential(*layers), lr, width, batch)


def transformer_shaped(torch, n, hidden):
    """n layers with the parameter tensors of a decoder layer (two LayerNorms, a fused QKV and an
    output projection, an MLP of 4x hidden; 12 tensors, ~12 hidden^2 elements), then a final
    LayerNorm: the parameter list an LLM's gradient monitor sees (a 7B model has ~300 tensors).
    The token mixing is a gate instead of attention: the comparison cost depends on the
    parameters, not on the forward."""
    nn = torch.nn

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = nn.LayerNorm(hidden)
            self.qkv_proj = nn.Linear(hidden, 3 * hidden)
            self.o_proj = nn.Linear(hidden, hidden)
            self.post_attention_layernorm = nn.LayerNorm(hidden)
            self.up_proj = nn.Linear(hidden, 4 * hidden)
            self.down_proj = nn.Linear(4 * hidden, hidden)

        def forward(self, x):
            q, k, v = self.qkv_proj(self.input_layernorm(x)).chunk(3, dim=-1)
            x = x + self.o_proj(q * torch.sigmoid(k) + v)
            return x + self.down_proj(torch.nn.functional.gelu(self.up_proj(self.post_attention_layernorm(x))))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(Layer() for _ in range(n))
            self.norm = nn.LayerNorm(hidden)

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.norm(x)

    return Model()


def _training(torch, model, lr, width, batch):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    xs = [torch.randn(batch, width) for _ in range(N_BATCHES)]
    target = torch.randn(batch, width)

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(xs[i % N_BATCHES]), target)
        loss.backward()
        opt.step()

    return model, opt, step


def sizes(path):
    total = signs = files = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            size = os.stat(os.path.join(root, name)).st_size
            total += size
            if name.endswith(".npy"):
                signs += size
                files += 1
    return total, signs, files


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["msprobe", "plain", "compare"], default="msprobe")
    ap.add_argument("paths", nargs="*", help="with --mode compare: DUMP_A DUMP_B OUT")
    ap.add_argument("--dump", default="./msprobe_grad_dump")
    ap.add_argument("--level", default="L2")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--blocks", default=None, help="N,WIDTH,HIDDEN,BATCH: the block model of make_workload")
    ap.add_argument("--layers", default=None, help="N,HIDDEN,BATCH: the transformer-shaped model of make_workload")
    args = ap.parse_args(argv)
    blocks = tuple(int(v) for v in args.blocks.split(",")) if args.blocks else None
    layers = tuple(int(v) for v in args.layers.split(",")) if args.layers else None

    if args.mode == "compare":
        a, b, out = args.paths
        t0 = time.perf_counter()
        from msprobe import GradComparator

        t1 = time.perf_counter()
        GradComparator.compare_distributed(a, b, out)
        t2 = time.perf_counter()
        print(json.dumps({"mode": "compare", "import_s": t1 - t0, "call_s": t2 - t1}))
        return 0

    import torch

    torch.set_num_threads(args.threads)
    model, _opt, step = make_workload(args.seed, args.lr, torch, blocks, layers)
    if args.mode == "msprobe":
        from msprobe.pytorch import PrecisionDebugger

        os.makedirs(args.dump, exist_ok=True)
        config = os.path.join(args.dump, "..", os.path.basename(os.path.normpath(args.dump)) + "_config.json")
        with open(config, "w") as f:
            json.dump({"task": "grad_probe", "dump_path": args.dump, "rank": [], "step": [],
                       "grad_probe": {"grad_level": args.level, "param_list": [], "bounds": [-1, 0, 1]}}, f)
        PrecisionDebugger(config_path=config).monitor(model)
    for i in range(args.warmup):
        step(i)
    times = []
    t0 = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        s0 = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - s0)
    total = time.perf_counter() - t0
    result = {"mode": args.mode, "step_s": times, "total_s": total, "threads": torch.get_num_threads()}
    if args.mode == "msprobe":
        result["bytes_on_disk"], result["sign_bytes"], result["sign_files"] = sizes(args.dump)
    sys.stdout.flush()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
