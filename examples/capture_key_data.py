"""A small policy-gradient loop instrumented with rlprobe: what inserting the probe looks like.

    python examples/capture_key_data.py --out ./dumps/a
    python examples/capture_key_data.py --out ./dumps/b --perturb-step 2
    rlprobe info ./dumps/b

The model is a toy (an embedding and a linear head over a 64-token vocabulary), but the data
flow is PPO's: prompts -> sampled responses -> rewards -> log_prob / ref_log_prob -> KL ->
advantages -> loss, over micro-batches, with timings logged per step.
"""

from __future__ import annotations

import argparse
import time

import torch

import rlprobe

VOCAB, PROMPT_LEN, RESPONSE_LEN = 64, 8, 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="dump directory")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--micro-batches", type=int, default=2)
    ap.add_argument("--perturb-step", type=int, default=-1, help="add noise to log_prob from this step on")
    ap.add_argument("--overwrite", action="store_true", help="replace an earlier dump in --out")
    args = ap.parse_args()

    torch.manual_seed(0)
    policy = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 32), torch.nn.Linear(32, VOCAB))
    reference = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 32), torch.nn.Linear(32, VOCAB))
    reference.load_state_dict(policy.state_dict())
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    config = {"algorithm": "ppo", "kl_coef": 0.05, "lr": 0.1, "micro_batches": args.micro_batches}

    with rlprobe.Probe(args.out, framework="torch", mode="overwrite" if args.overwrite else "new") as probe:
        probe.save_config(config)
        for step in range(args.steps):
            t0 = time.perf_counter()
            for _ in range(args.micro_batches):
                prompts = torch.randint(0, VOCAB, (4, PROMPT_LEN))
                with torch.no_grad():
                    logits = policy(prompts[:, -1:]).expand(-1, RESPONSE_LEN, -1)
                    responses = torch.distributions.Categorical(logits=logits).sample()
                rewards = (responses % 2 == 0).float().mean(dim=1)
                log_prob = torch.log_softmax(policy(responses), -1).gather(-1, responses[..., None])[..., 0]
                if 0 <= args.perturb_step <= step:
                    log_prob = log_prob + 1e-3 * torch.randn_like(log_prob)
                with torch.no_grad():
                    ref_log_prob = torch.log_softmax(reference(responses), -1).gather(-1, responses[..., None])[..., 0]
                kl = log_prob.detach() - ref_log_prob
                advantages = rewards[:, None] - config["kl_coef"] * kl
                advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-6)
                pg_loss = -(advantages * log_prob).mean()
                kl_loss = kl.mean()
                loss = pg_loss + config["kl_coef"] * kl_loss
                opt.zero_grad()
                loss.backward()
                opt.step()
                probe.save({"prompts": prompts, "responses": responses, "rewards": rewards,
                            "log_prob": log_prob, "ref_log_prob": ref_log_prob, "advantages": advantages,
                            "kl_loss": kl_loss, "loss": loss})
            probe.log_metrics({"timing/step": time.perf_counter() - t0, "loss": loss, "reward_mean": rewards.mean()})
            probe.step()
    print(f"wrote {args.steps} steps x {args.micro_batches} micro-batches to {args.out}; try: rlprobe info {args.out}")


if __name__ == "__main__":
    main()
