"""Time msprobe 8.1.2's SingleSave.save on a fixed workload (baseline for rlprobe).

Run with the msprobe venv's interpreter (see benchmarks/setup_msprobe_venv.sh):

    .venv-msprobe/bin/python benchmarks/msprobe_save_workload.py --dump /tmp/msprobe_dump

Workload: 8 keys ("key0".."key7"), each one 64x4096 tensor; even keys float32
(torch.randn), odd keys int64 (torch.randint(0, 50000)). Data, seeded with
torch.manual_seed(seed), is generated in key order before any timing:

    torch.manual_seed(seed)
    for k in range(8):
        t[k] = torch.randn(64, 4096) if k % 2 == 0 else torch.randint(0, 50000, (64, 4096))

8 steps x 4 micro steps; in each micro step every key is saved with its own call
SingleSave.save({key: tensor}) (so 4 save calls per key per step, 256 calls in all;
msprobe numbers micro_step0..3 by itself and SingleSave.step() advances the step).

Prints one JSON line:
  save_blocking_s: sum of time.perf_counter() around each SingleSave.save call
  total_s:         wall time of the whole save/step loop
  bytes_on_disk:   sum of st_size of every file under --dump afterwards
  calls:           number of SingleSave.save calls

--cold (issue 17, the first saves of a fresh process): 8 save calls, each of six float32
[64, 4096] tensors (COLD_FLOAT_KEYS), "responses" int64 [64, 4096] and "prompts" int64
[64, 512] with values in [0, 150000] (make_cold_calls, generated before anything is timed),
step() after every fourth; save_blocking_s runs from the first save to the last one's return
(the step after the fourth inside it, the last step after it); init_s times the construction.
benchmarks/save_overhead.py --cold runs the same with rlprobe, each in a fresh process.
"""
import argparse
import json
import os
import sys
import time

N_KEYS = 8
SHAPE = (64, 4096)
MICRO_STEPS = 4
STEPS = 8
INT_HIGH = 50000


def make_data(seed):
    import torch

    torch.manual_seed(seed)
    data = {}
    for k in range(N_KEYS):
        if k % 2 == 0:
            data[f"key{k}"] = torch.randn(*SHAPE)
        else:
            data[f"key{k}"] = torch.randint(0, INT_HIGH, SHAPE)
    return data


COLD_CALLS = 8
COLD_FLOAT_KEYS = ("log_prob", "old_log_prob", "ref_log_prob", "advantages", "returns", "values")
COLD_INT_HIGH = 150000


def make_cold_calls(seed):
    import torch

    torch.manual_seed(seed)
    calls = []
    for _ in range(COLD_CALLS):
        call = {key: torch.randn(64, 4096) for key in COLD_FLOAT_KEYS}
        call["responses"] = torch.randint(0, COLD_INT_HIGH + 1, (64, 4096))
        call["prompts"] = torch.randint(0, COLD_INT_HIGH + 1, (64, 512))
        calls.append(call)
    return calls


def time_cold(calls, save, step):
    """Seconds from the first save to the last one's return, step() after every fourth save."""
    t0 = time.perf_counter()
    for i, call in enumerate(calls):
        save(call)
        if i % 4 == 3 and i < len(calls) - 1:
            step()
    blocking = time.perf_counter() - t0
    step()
    return blocking


def bytes_under(path):
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            total += os.stat(os.path.join(root, name)).st_size
    return total


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dump", required=True, help="dump directory (must not exist or be empty)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cold", action="store_true", help="the cold workload (see above)")
    args = ap.parse_args(argv)

    if os.path.isdir(args.dump) and os.listdir(args.dump):
        sys.exit(f"--dump {args.dump} is not empty")

    if args.cold:
        calls = make_cold_calls(args.seed)
        t0 = time.perf_counter()
        from msprobe.core import SingleSave

        SingleSave(args.dump, fmk="pytorch")
        init = time.perf_counter() - t0
        blocking = time_cold(calls, SingleSave.save, SingleSave.step)
        print(json.dumps({"tool": "msprobe", "init_s": round(init, 6), "save_blocking_s": round(blocking, 6),
                          "bytes_on_disk": bytes_under(args.dump), "calls": len(calls)}))
        return

    from msprobe.core import SingleSave

    data = make_data(args.seed)
    SingleSave(args.dump, fmk="pytorch")

    blocking = 0.0
    calls = 0
    t0 = time.perf_counter()
    for _step in range(STEPS):
        for _micro in range(MICRO_STEPS):
            for key, tensor in data.items():
                c0 = time.perf_counter()
                SingleSave.save({key: tensor})
                blocking += time.perf_counter() - c0
                calls += 1
        SingleSave.step()
    total = time.perf_counter() - t0

    print(json.dumps({
        "tool": "msprobe",
        "save_blocking_s": round(blocking, 6),
        "total_s": round(total, 6),
        "bytes_on_disk": bytes_under(args.dump),
        "calls": calls,
    }))


if __name__ == "__main__":
    main()
