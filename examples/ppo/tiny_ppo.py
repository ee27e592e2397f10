"""A small but real PPO trainer, instrumented with rlprobe. `rlprobe demo` runs it.

    python examples/ppo/tiny_ppo.py --config examples/ppo/config.yaml --out ./dumps/base
    python examples/ppo/tiny_ppo.py --config examples/ppo/config.yaml --out ./dumps/bad --fault ref-bf16
    python examples/ppo/tiny_ppo.py --out ./dumps/replayed --replay-from ./dumps/base --fault advantage-bug@2
    torchrun --nproc-per-node 2 examples/ppo/tiny_ppo.py --config examples/ppo/config.yaml --out ./dumps/ddp

The flow follows PPO as RLHF frameworks run it: synthetic prompts -> the rollout engine (a copy
of the actor whose weights are synced after every update) samples responses -> a rule reward
plus a small reward model (trained first on synthetic preference pairs with the pairwise
logsigmoid loss) score them -> the actor recomputes old log-probs, the frozen reference model
ref log-probs, the critic values -> per-token KL penalty -> GAE advantages and returns -> PPO
epochs over micro-batches with the clipped policy loss and clipped value loss -> optimizer
steps -> weight sync. Timings and throughput are logged the way MindSpeed-RL names them.

Faults that `--fault` plants (what rlprobe should conclude):
  ref-bf16          the reference model runs in bfloat16            -> ref_log_prob, reference forward
  nondeterministic  one actor layer reduces in a random order       -> old_log_prob, that layer
  advantage-bug     GAE uses the wrong lambda                       -> advantages, not a model
  sampling-seed     the rollout samples with another seed           -> responses, rollout sampling
  lr                the actor's learning rate differs               -> responses from step 1, the update
  rollout-bf16      the rollout engine computes in bfloat16         -> rollout_log_prob vs old_log_prob (check)
  stale-rollout-weights  the rollout engine is never re-synced      -> rollout_log_prob vs old_log_prob from step 1
`--fault NAME@STEP` plants it from step STEP on; `--fault` may be given several times.

`--replay-from DUMP` (or rlprobe_config.replay_from) consumes the baseline's rollout: each step's
prompts and sampled tokens are DUMP's (the rollout engine scores those tokens instead of drawing its
own) and so are the rewards, so the trainer side is compared on the same tokens (docs/replay.md).
The rollout engine's own log-probs of the sampled tokens, computed at generation time, are saved as
`rollout_log_prob`; `rlprobe check DUMP` compares them with the trainer's `old_log_prob`.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml

import rlprobe
from rlprobe.capture.config import apply_overrides

FAULTS = ("ref-bf16", "nondeterministic", "advantage-bug", "sampling-seed", "lr", "rollout-bf16",
          "stale-rollout-weights")


# -- models --------------------------------------------------------------------------------
class Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        out = torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v
        return self.proj(out.transpose(1, 2).reshape(b, t, d))


class OrderedLinear(nn.Linear):
    """nn.Linear; with `nondeterministic` set, it sums the input features in a different order on
    every call, like an atomic-add reduction on a GPU: equal in exact arithmetic, not in float32."""

    def __init__(self, d_in: int, d_out: int, nondeterministic: bool = False):
        super().__init__(d_in, d_out)
        self.nondeterministic = nondeterministic
        self._order = torch.Generator().manual_seed(1234)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.nondeterministic:
            return super().forward(x)
        perm = torch.randperm(x.shape[-1], generator=self._order)
        return x[..., perm] @ self.weight[:, perm].t() + self.bias


class MLP(nn.Module):
    def __init__(self, d: int, nondeterministic: bool = False):
        super().__init__()
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = OrderedLinear(4 * d, d, nondeterministic)  # the planted fault lives here

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, nondeterministic: bool = False):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = MLP(d, nondeterministic)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    """A causal transformer; `head` is the LM head (vocab logits) or a scalar head (critic, reward)."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, max_len: int, out: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        self.layers = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, out)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln_f(x))


def token_log_probs(model: nn.Module, seq: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """log p(response token | prefix) for every response position, in float32."""
    logits = model(seq[:, :-1]).float()[:, prompt_len - 1:]
    return torch.log_softmax(logits, dim=-1).gather(-1, seq[:, prompt_len:, None])[..., 0]


# -- data and rewards ----------------------------------------------------------------------
def make_prompts(gen: torch.Generator, n: int, length: int, vocab: int) -> torch.Tensor:
    return torch.randint(1, vocab, (n, length), generator=gen)


def rule_reward(responses: torch.Tensor) -> torch.Tensor:
    """Reward even tokens, like a format reward."""
    return (responses % 2 == 0).float().mean(dim=1)


def train_reward_model(cfg: dict[str, Any], gen: torch.Generator) -> TinyLM:
    """A small reward model trained on synthetic preference pairs (chosen: more even tokens)."""
    m = cfg["model"]
    rm = TinyLM(m["vocab"], m["d_model"], 1, m["heads"], m["prompt_len"] + m["response_len"], 1)
    opt = torch.optim.AdamW(rm.parameters(), lr=cfg["reward_model"]["lr"])
    length = m["prompt_len"] + m["response_len"]
    for _ in range(cfg["reward_model"]["steps"]):
        chosen = torch.randint(0, m["vocab"] // 2, (16, length), generator=gen) * 2
        rejected = torch.randint(0, m["vocab"] // 2, (16, length), generator=gen) * 2 + 1
        loss = -F.logsigmoid(rm(chosen)[:, -1, 0] - rm(rejected)[:, -1, 0]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return rm.requires_grad_(False)


# -- PPO maths -----------------------------------------------------------------------------
def gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    advantages = torch.zeros_like(rewards)
    last = torch.zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        next_value = values[:, t + 1] if t + 1 < rewards.shape[1] else torch.zeros(rewards.shape[0])
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last = delta + gamma * lam * last
        advantages[:, t] = last
    return advantages, advantages + values


def whiten(x: torch.Tensor) -> torch.Tensor:
    return (x - x.mean()) / (x.std() + 1e-8)


@torch.no_grad()
def sample(model: nn.Module, prompts: torch.Tensor, length: int, uniforms: torch.Tensor, temperature: float,
           forced: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompts + sampled responses, the engine's log-probs of the sampled tokens), as vLLM returns them.
    Inverse-CDF sampling with one row of uniforms per sample (see sample_uniforms); `forced` (a replayed
    baseline's responses) are taken instead of the draws, their log-probs computed the same way."""
    seq, log_probs = prompts, []
    for t in range(length):
        logits = model(seq)[:, -1].float() / temperature
        probs = torch.softmax(logits, -1)
        nxt = (probs.cumsum(-1) < uniforms[:, t:t + 1]).sum(-1, keepdim=True).clamp(max=probs.shape[-1] - 1)
        if forced is not None:
            nxt = forced[:, t:t + 1]
        log_probs.append(torch.log_softmax(logits, -1).gather(-1, nxt))
        seq = torch.cat([seq, nxt], dim=1)
    return seq, torch.cat(log_probs, dim=1)


def sample_uniforms(seed: int, step: int, samples: range, length: int) -> torch.Tensor:
    """The sampling randomness of each sample, seeded by its global index in the step's batch: the
    same samples get the same draws whatever the layout (ranks, micro-batches)."""
    seeds = (seed * 1_000_003 + step * 10_007 + i for i in samples)
    return torch.stack([torch.rand(length, generator=torch.Generator().manual_seed(s)) for s in seeds])


def data_parallel(world: int, *models: nn.Module) -> list[nn.Module]:
    """The trained models as this rank trains them: wrapped in DistributedDataParallel (gloo) when
    there are several ranks, so every rank steps one model with all-reduced gradients."""
    if world == 1:
        return list(models)
    from torch.nn.parallel import DistributedDataParallel

    return [DistributedDataParallel(m) for m in models]


def whiten_global(x: torch.Tensor, world: int) -> torch.Tensor:
    """whiten() over the global batch: the ranks' shares gathered, whitened together, sliced back."""
    if world == 1:
        return whiten(x)
    import torch.distributed as dist

    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous())
    return whiten(torch.cat(parts))[dist.get_rank() * x.shape[0]:(dist.get_rank() + 1) * x.shape[0]]


# -- the trainer ---------------------------------------------------------------------------
def planted(fault: str | list[str] | None) -> dict[str, int]:
    """`--fault` values (NAME, or NAME@STEP: from step STEP on) as {name: first step}."""
    found = {}
    for item in [fault] if isinstance(fault, str) else fault or []:
        name, _, start = item.partition("@")
        if name not in FAULTS or (start and not start.isdigit()):
            raise SystemExit(f"--fault {item!r}: expected NAME or NAME@STEP, NAME one of {', '.join(FAULTS)}")
        found[name] = int(start or 0)
    return found


def replay_rollout(probe: Any, micro: int, data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The baseline's values of `data` (this rank's batch), read one micro-batch at a time as they were saved."""
    parts = [probe.replay({k: v.chunk(micro)[i] for k, v in data.items()}, micro_step=i) for i in range(micro)]
    return {k: torch.cat([part[k] for part in parts]) for k in data}


def train(cfg: dict[str, Any], out: str | None = None, fault: str | list[str] | None = None,
          mode: str = "overwrite", replay_from: str | None = None) -> Path:
    faults = planted(fault)

    def on(name: str, step: int) -> bool:
        return name in faults and step >= faults[name]

    torch.set_num_threads(1)  # tiny matrices: threads only add scheduling noise
    rank, world = 0, 1
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    m, p = cfg["model"], cfg["ppo"]
    probe_cfg = copy.deepcopy(cfg)
    if out is not None:
        probe_cfg.setdefault("rlprobe_config", {})["dump_path"] = str(out)
    if replay_from is not None:
        probe_cfg.setdefault("rlprobe_config", {})["replay_from"] = str(replay_from)
    replaying = probe_cfg.get("rlprobe_config", {}).get("replay_from") is not None
    probe = rlprobe.from_config(probe_cfg, mode=mode)

    torch.manual_seed(cfg["seed"])
    data_gen = torch.Generator().manual_seed(cfg["seed"])  # the global batch: each rank takes its share
    max_len = m["prompt_len"] + m["response_len"]
    actor = TinyLM(m["vocab"], m["d_model"], m["layers"], m["heads"], max_len, m["vocab"])
    rollout = TinyLM(m["vocab"], m["d_model"], m["layers"], m["heads"], max_len, m["vocab"])  # the inference engine
    reference = TinyLM(m["vocab"], m["d_model"], m["layers"], m["heads"], max_len, m["vocab"])
    critic = TinyLM(m["vocab"], m["d_model"], m["layers"], m["heads"], max_len, 1)
    rollout.load_state_dict(actor.state_dict())
    reference.load_state_dict(actor.state_dict())
    reference.requires_grad_(False)
    reward_model = train_reward_model(cfg, torch.Generator().manual_seed(cfg["seed"] + 1))
    actor_opt = torch.optim.AdamW(actor.parameters(), lr=p["actor_lr"])
    critic_opt = torch.optim.AdamW(critic.parameters(), lr=p["critic_lr"])
    probe.save_config(cfg)
    probe.monitor_grads(actor, optimizer=actor_opt, name="actor", level="L1")
    probe.monitor_grads(critic, optimizer=critic_opt, name="critic", level="L0")
    probe.monitor_params(actor, optimizer=actor_opt, name="actor")  # the weights after each update
    probe.monitor_params(critic, optimizer=critic_opt, name="critic")

    global_batch, micro = p["batch_size"], p["micro_batches"]
    if global_batch % (world * micro):
        raise SystemExit(f"ppo.batch_size {global_batch} must divide into {world} rank(s) x {micro} micro-batches")
    batch = global_batch // world  # this rank's share
    mb = batch // micro
    mine = range(rank * batch, (rank + 1) * batch)  # the global indices of this rank's samples
    train_actor, train_critic = data_parallel(world, actor, critic)
    for step in range(p["steps"]):
        # the planted faults of this step (a fault from step S on leaves the steps before S clean)
        if on("ref-bf16", step):
            reference.to(torch.bfloat16)
        if on("rollout-bf16", step):
            rollout.to(torch.bfloat16)  # weight syncs keep its dtype: load_state_dict copies into bf16
        actor.layers[-1].mlp.fc2.nondeterministic = on("nondeterministic", step)
        for group in actor_opt.param_groups:
            group["lr"] = p["actor_lr"] * (3.0 if on("lr", step) else 1.0)
        lam = p["lam"] * (0.5 if on("advantage-bug", step) else 1.0)
        sampling_seed = cfg["sampling_seed"] + (7 if on("sampling-seed", step) else 0)

        t_all = time.perf_counter()
        prompts = make_prompts(data_gen, global_batch, m["prompt_len"], m["vocab"])[mine.start:mine.stop]
        t0 = time.perf_counter()
        uniforms = sample_uniforms(sampling_seed, step, mine, m["response_len"])
        forced = None
        if replaying:  # the baseline's prompts and tokens; this run's engine scores the tokens as it samples
            replayed = replay_rollout(probe, micro, {"prompts": prompts, "responses": torch.zeros(
                batch, m["response_len"], dtype=torch.int64)})
            prompts, forced = replayed["prompts"], replayed["responses"]
        seq, rollout_log_prob = sample(rollout, prompts, m["response_len"], uniforms, p["temperature"], forced)
        timing = {"timing/rollout": time.perf_counter() - t0}
        responses = seq[:, m["prompt_len"]:]

        t0 = time.perf_counter()
        with probe.stage("reward_compute", model=reward_model, steps=_steps(cfg)), torch.no_grad():
            scores = rule_reward(responses) + torch.sigmoid(reward_model(seq)[:, -1, 0])
        if replaying:
            scores = replay_rollout(probe, micro, {"rewards": scores})["rewards"]
        timing["timing/rule_reward"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        with probe.stage("actor_compute_log_prob", model=actor, steps=_steps(cfg)), torch.no_grad():
            old_log_prob = token_log_probs(actor, seq, m["prompt_len"])
        timing["timing/old_log_p"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        with probe.stage("reference_compute_log_prob", model=reference, steps=_steps(cfg)), torch.no_grad():
            ref_log_prob = token_log_probs(reference, seq, m["prompt_len"])
        timing["timing/reference_model"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        with probe.stage("critic_compute_values", model=critic, steps=_steps(cfg)), torch.no_grad():
            values = critic(seq[:, :-1])[:, m["prompt_len"] - 1:, 0]
        timing["timing/critic_model"] = time.perf_counter() - t0

        kl = old_log_prob - ref_log_prob
        token_level_scores = torch.zeros_like(kl)
        token_level_scores[:, -1] = scores  # the sequence reward sits on the last token
        token_level_rewards = token_level_scores - p["kl_coef"] * kl  # per-token KL penalty
        advantages, returns = gae(token_level_rewards, values, p["gamma"], lam)
        advantages = whiten_global(advantages, world)
        for i in range(micro):
            s = slice(i * mb, (i + 1) * mb)
            probe.save({"prompts": prompts[s], "responses": responses[s], "rewards": scores[s],
                        "token_level_scores": token_level_scores[s], "values": values[s],
                        "rollout_log_prob": rollout_log_prob[s], "old_log_prob": old_log_prob[s],
                        "ref_log_prob": ref_log_prob[s], "kl": kl[s],
                        "token_level_rewards": token_level_rewards[s], "advantages": advantages[s],
                        "returns": returns[s]})

        t0 = time.perf_counter()
        for _epoch in range(p["ppo_epochs"]):
            actor_opt.zero_grad()
            critic_opt.zero_grad()
            for i in range(micro):
                s = slice(i * mb, (i + 1) * mb)
                # backward inside the update stages, so module dumps hold its gradients (docs/modules.md)
                with probe.stage("actor_update", model=actor, steps=_steps(cfg)):
                    log_prob = token_log_probs(train_actor, seq[s], m["prompt_len"])
                    ratio = torch.exp(log_prob - old_log_prob[s])
                    pg_loss = torch.max(-advantages[s] * ratio,
                                        -advantages[s] * ratio.clamp(1 - p["clip"], 1 + p["clip"])).mean()
                    kl_loss = (log_prob - ref_log_prob[s]).mean()
                    entropy = -log_prob.mean()
                    loss = pg_loss + p["kl_coef"] * kl_loss
                    (loss / micro).backward()
                with probe.stage("critic_update", model=critic, steps=_steps(cfg)):
                    v = train_critic(seq[s, :-1])[:, m["prompt_len"] - 1:, 0]
                    v_clipped = values[s] + (v - values[s]).clamp(-p["clip"], p["clip"])
                    vf_loss = 0.5 * torch.max((v - returns[s]) ** 2, (v_clipped - returns[s]) ** 2).mean()
                    (vf_loss / micro).backward()
                probe.save({"log_prob": log_prob, "ratio": ratio, "pg_loss": pg_loss, "vf_loss": vf_loss,
                            "kl_loss": kl_loss, "entropy": entropy, "loss": loss},
                           sample_ids=list(mine[s]))  # the samples' global indices
            torch.nn.utils.clip_grad_norm_(actor.parameters(), 1.0)
            actor_opt.step()
            critic_opt.step()
        timing["timing/update"] = time.perf_counter() - t0
        if not on("stale-rollout-weights", step):
            rollout.load_state_dict(actor.state_dict())  # weight sync to the inference engine
        timing["timing/all"] = time.perf_counter() - t_all
        tokens = batch * max_len / world
        probe.log_metrics({**timing, "e2e_tps": tokens / timing["timing/all"],
                           "update_tps": tokens / timing["timing/update"], "vllm_tps": tokens / timing["timing/rollout"],
                           "response_length/mean": float(m["response_len"]), "reward/mean": scores.mean(),
                           "actor/pg_loss": pg_loss, "critic/vf_loss": vf_loss, "actor/kl_loss": kl_loss})
        probe.step()
    probe.close()
    if world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()
    return Path(probe_cfg.get("rlprobe_config", {}).get("dump_path", "."))


def _steps(cfg: dict[str, Any]) -> str:
    rc = cfg.get("rlprobe_config", {})
    return f"{rc.get('step_start', 0)}-{rc.get('step_end', 10**9)}"


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    return apply_overrides(yaml.safe_load(Path(path).read_text(encoding="utf-8")), overrides)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(Path(__file__).with_name("config.yaml")))
    ap.add_argument("--out", help="dump directory (overrides rlprobe_config.dump_path)")
    ap.add_argument("--fault", action="append", metavar="NAME[@STEP]",
                    help=f"plant a fault (from step STEP on), repeatable: {', '.join(FAULTS)}")
    ap.add_argument("--replay-from", metavar="DUMP", help="consume DUMP's rollout (prompts, responses, rewards)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config value, e.g. --set ppo.steps=2 (YAML syntax for the value)")
    args = ap.parse_args()
    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[key] = yaml.safe_load(value)
    path = train(load_config(args.config, overrides), args.out, args.fault, replay_from=args.replay_from)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
