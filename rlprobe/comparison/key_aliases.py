"""The data flow's keys and trainers' names for them. First the order in which PPO/GRPO data is produced,
used to pick the *first* divergence in a step, and what each key is computed from (UPSTREAM_OF: the
verdict's rules and the amplification point): DESIGN.md's default order, plus `token_level_rewards` (the
scores minus the KL penalty, as verl names them) right after `kl`, where it is computed.

Then trainers' own key names -> rlprobe's canonical keys, so the verdict rules (UPSTREAM_OF, RULES) see
`old_log_prob` where a verl run saved `old_log_probs` (docs/compare.md, "Key names").

The built-in table is rlprobe/key_names.csv (TRL, verl, OpenRLHF, MindSpeed-RL, and spellings of
any trainer), the one table capture and check read too; its ambiguous names are decided by the keys
either run saved. `rlprobe compare --key-map SAVED=CANONICAL` and a pipeline's `key_map:` add to it
and win."""

from __future__ import annotations

import functools
from typing import Iterable, Mapping

import pyarrow as pa

from rlprobe.errors import ProbeError
from rlprobe.key_names import canonical_names, rows


DEFAULT_ORDER = (
    "prompts", "responses", "rollout_log_prob",  # the inference engine's log-probs, with the rollout
    "rewards", "token_level_scores", "values", "old_log_prob", "ref_log_prob",
    "kl", "token_level_rewards", "advantages", "returns", "log_prob", "ratio", "pg_loss", "vf_loss", "kl_loss", "entropy", "loss",
)

# canonical key -> the keys it is computed from (at the same step)
UPSTREAM_OF = {
    "responses": ("prompts",),
    "rollout_log_prob": ("prompts", "responses"),
    "rewards": ("prompts", "responses"),
    "token_level_scores": ("prompts", "responses"),
    "values": ("prompts", "responses"),
    "old_log_prob": ("prompts", "responses"),
    "ref_log_prob": ("prompts", "responses"),
    "kl": ("old_log_prob", "ref_log_prob"),
    "token_level_rewards": ("token_level_scores", "kl"),
    "advantages": ("rewards", "token_level_scores", "values", "old_log_prob", "ref_log_prob", "kl",
                   "token_level_rewards"),
    "returns": ("rewards", "token_level_scores", "values"),
    "log_prob": ("prompts", "responses"),
    "ratio": ("log_prob", "old_log_prob"),
    "pg_loss": ("advantages", "ratio"),
    "vf_loss": ("values", "returns"),
    "kl_loss": ("log_prob", "ref_log_prob"),
    "entropy": ("log_prob",),
    "loss": ("pg_loss", "vf_loss", "kl_loss", "entropy"),
}


@functools.lru_cache(maxsize=None)
def computed_from(canonical_key: str) -> tuple[str, ...]:
    """Every key `canonical_key` is computed from, directly or through others (UPSTREAM_OF's closure):
    where an intermediate key was not captured, its own inputs stand for it."""
    found: list[str] = []
    todo = list(UPSTREAM_OF.get(canonical_key, ()))
    while todo:
        key = todo.pop(0)
        if key not in found and key != canonical_key:
            found.append(key)
            todo += UPSTREAM_OF.get(key, ())
    return tuple(found)


def builtin_rows() -> tuple[dict[str, str], ...]:
    """rlprobe/key_names.csv's rows: trainer, name, canonical, when_saved, sample_id, note."""
    return rows()


def parse_key_map(items: Iterable[str] | Mapping[str, str] | None, what: str = "--key-map",
                  order: Iterable[str] | None = None) -> dict[str, str]:
    """{saved: canonical} from ["old=new", ...] (the CLI) or a mapping (a pipeline's key_map:).
    Raises ProbeError naming the entry when it is not SAVED=CANONICAL with a canonical key of
    the data flow."""
    flow = list(order or DEFAULT_ORDER)
    pairs = list(items.items()) if isinstance(items, Mapping) else [_split(item, what) for item in items or ()]
    result = {}
    for saved, canonical in pairs:
        saved, canonical = str(saved).strip(), str(canonical).strip()
        if not saved or not canonical:
            raise ProbeError(f"{what} {saved}={canonical}: expected SAVED=CANONICAL, both non-empty "
                             "(e.g. old_log_probs=old_log_prob)")
        try:
            result[saved] = flow_key(canonical, flow)
        except ProbeError as e:
            raise ProbeError(f"{what} {saved}={canonical}: {e}") from None
    return result


def flow_key(canonical: str, order: Iterable[str] | None = None) -> str:
    """`canonical` when it is a key of the data flow, else a ProbeError listing them."""
    flow = list(order or DEFAULT_ORDER)
    if canonical not in flow:
        raise ProbeError(f"{canonical!r} is not a key of the data flow; expected one of {', '.join(flow)}")
    return canonical


def aliases(key_map: Mapping[str, str] | None = None, saved_keys: Iterable[str] = ()) -> dict[str, str]:
    """saved name -> canonical key: rlprobe/key_names.csv, its ambiguous names decided by `saved_keys`
    (both runs' keys: one comparison reads a key one way), then `key_map`."""
    return canonical_names(saved_keys, key_map)


def key_order_table(order: list[str] | tuple[str, ...] | None = None,
                    key_map: Mapping[str, str] | None = None, saved_keys: Iterable[str] = ()) -> pa.Table:
    """(name, canonical, position) for every key of the data flow and every alias (a user's
    key_map may rename a flow key itself, e.g. rewards=token_level_scores); unknown keys sort after.
    `saved_keys`: the keys either run saved, which decide the table's ambiguous names."""
    order = list(order or DEFAULT_ORDER)
    table = aliases(key_map, saved_keys)
    names, canon, pos = [], [], []
    for i, key in enumerate(order):
        if key not in table:
            names.append(key), canon.append(key), pos.append(i)
    for alias, target in table.items():
        if target in order:
            names.append(alias), canon.append(target), pos.append(order.index(target))
    return pa.table({"name": names, "canonical": canon, "position": pa.array(pos, pa.int64())})


def flow_warning(saved_keys: Iterable[str], key_map: Mapping[str, str] | None = None,
                 order: list[str] | tuple[str, ...] | None = None) -> str | None:
    """A warning when keys were saved but none of them is (or is an alias of) a data-flow key:
    the verdict can then only say 'the code that produces KEY'."""
    keys = sorted(set(saved_keys))
    if not keys:
        return None
    flow, table = set(order or DEFAULT_ORDER), aliases(key_map, keys)
    if any(k in flow or table.get(k) in flow for k in keys):
        return None
    shown = ", ".join(keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")
    return (f"no saved key is in rlprobe's data flow (saved: {shown}), so the verdict cannot name a stage; "
            "map them with --key-map SAVED=CANONICAL (pipeline: key_map:) to prompts, responses, old_log_prob, "
            "ref_log_prob, log_prob, advantages, ... (docs/compare.md, 'Key names')")


def _split(item: str, what: str) -> tuple[str, str]:
    saved, sep, canonical = str(item).partition("=")
    if not sep:
        raise ProbeError(f"{what} {item}: expected SAVED=CANONICAL (e.g. old_log_probs=old_log_prob)")
    return saved, canonical
