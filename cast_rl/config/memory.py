"""GPU memory each actor of a configuration needs: an estimate computed from the model sizes.

    cast-rl plan configs/paper/qwen3_4b_1x8gpu.yaml [key=value ...] [--gpu-gib 80] [--markdown]

An estimate, not a measurement, per GPU of each actor (GiB = 2**30 bytes):

* **vLLM engines** (rollout workers, the critic service, the teacher, an LLM labeller, the user
  simulator's server) reserve ``gpu_memory_utilization`` x the GPU's memory on each of their
  ``tensor_parallel_size`` GPUs.  Their weights take ``params x bytes / tp`` of it; the rest is
  the most the KV cache can have (vLLM also takes its profiled activation peak and, without
  ``enforce_eager``, CUDA graphs out of it, so the real cache is somewhat smaller).  One token's
  KV cache is ``2 (K and V) x layers x kv_heads x head_dim x bytes``, the KV heads split over the
  tensor-parallel ranks.  vLLM refuses to start unless one ``max_model_len`` sequence fits.
  The critic, the teacher and an LLM labeller are served in their ``model.dtype`` (a trained
  critic's checkpoint holds the learner's float32 master weights; vLLM casts them).
* **The FSDP learner** (``learner.num_workers`` ranks) holds float32 master weights (it loads the
  model in float32; ``policy.dtype=bfloat16`` only sets the compute dtype), float32 gradients and
  AdamW's two float32 moments, each sharded over the ranks: ``16 x params / ranks`` bytes, plus a
  frozen float32 reference model (``4 x params / ranks``) when ``algorithm.kl_coef > 0``.  With
  ``learner.lora.rank`` the base is frozen (no gradient, no optimizer state, and the reference
  is the base with its adapters off) and only the adapters carry the 16 bytes per parameter.
  Working memory: two decoder layers gathered in the compute dtype (FSDP's all-gather and its
  prefetch), each layer's input kept by activation checkpointing
  (``tokens x hidden x layers`` in the compute dtype) and float32 logits of the micro-batch in
  the worst case that every token carries loss (``tokens x vocab x 4``); tokens are
  ``learner.max_tokens_per_micro_batch`` (else ``micro_batch_size x inference.max_model_len``).
  The one layer recomputed in the backward pass and allocator fragmentation are not counted, nor,
  without ``learner.activation_checkpointing``, the activations every layer then keeps.

Architectures come from the model directory's ``config.json`` when it exists, else from
:data:`QWEN3_ARCHS` (the paper's models, by the directory's or endpoint's name), else, for a
model the run builds itself (``make_tiny_if_missing``), from its ``model.tiny`` size.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from cast_rl.config.schema import CastConfig, InferenceConfig, ModelConfig

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
VLLM_SERVE_UTILIZATION = 0.9
"""``vllm serve``'s default gpu_memory_utilization: the user simulator's server is started outside
the job, so its own settings decide; the estimate assumes the default."""


@dataclass(frozen=True)
class Arch:
    """A decoder-only transformer's sizes, as its Hugging Face config.json names them."""

    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool
    qk_norm: bool = True
    """Qwen3's per-head RMSNorm of queries and keys (head_dim weights each); Llama has none."""
    dtype: str = "bfloat16"
    """The checkpoint's dtype (what vLLM serves with dtype=auto)."""

    @property
    def layer_params(self) -> int:
        """One decoder layer: attention (no biases), the gated MLP and the norms."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = h * q + 2 * h * kv + q * h
        mlp = 3 * h * self.intermediate_size
        norms = 2 * h + (2 * self.head_dim if self.qk_norm else 0)
        return attention + mlp + norms

    @property
    def params(self) -> int:
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * self.layer_params + embeddings + self.hidden_size  # + the final norm

    def kv_bytes_per_token(self, dtype_bytes: int, tp: int = 1) -> int:
        """KV cache of one token on one of ``tp`` tensor-parallel GPUs (vLLM splits the KV heads
        over the ranks, or replicates one per rank when there are fewer heads than ranks)."""
        kv_heads = max(1, self.num_kv_heads // tp)
        return 2 * self.num_layers * kv_heads * self.head_dim * dtype_bytes

    def lora_params(self, rank: int, targets: list[str]) -> int:
        """Adapter parameters: rank x (in + out) per targeted linear layer per decoder layer."""
        h, i = self.hidden_size, self.intermediate_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                  "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
        unknown = [t for t in targets if t not in shapes]
        if unknown:
            raise ValueError(f"learner.lora.target_modules={targets!r}: no size known for {unknown}; the "
                             f"estimate knows {', '.join(shapes)}")
        return self.num_layers * sum(rank * sum(shapes[t]) for t in targets)


QWEN3_ARCHS = {
    "qwen3-4b": Arch("Qwen3-4B", 36, 2560, 9728, 151936, 32, 8, 128, tie_word_embeddings=True),
    "qwen3-8b": Arch("Qwen3-8B", 36, 4096, 12288, 151936, 32, 8, 128, tie_word_embeddings=False),
    "qwen3-32b": Arch("Qwen3-32B", 64, 5120, 25600, 151936, 64, 8, 128, tie_word_embeddings=False),
}
"""The paper's models, from the config.json each publishes on the Hugging Face Hub (Qwen/Qwen3-4B,
Qwen/Qwen3-8B, Qwen/Qwen3-32B; torch_dtype bfloat16): num_hidden_layers, hidden_size,
intermediate_size, vocab_size, num_attention_heads, num_key_value_heads, head_dim,
tie_word_embeddings.  Their parameter counts come out at 4.02B, 8.19B and 32.76B, the sizes the
model cards state (4.0B, 8.2B, 32.8B).  Keyed by the lower-cased directory or endpoint name."""


def arch_from_config_json(path: Path) -> Arch:
    """The :class:`Arch` of a Hugging Face ``config.json``."""
    c = json.loads(path.read_text())
    heads = c["num_attention_heads"]
    return Arch(
        name=path.parent.name, num_layers=c["num_hidden_layers"], hidden_size=c["hidden_size"],
        intermediate_size=c["intermediate_size"], vocab_size=c["vocab_size"], num_heads=heads,
        num_kv_heads=c.get("num_key_value_heads") or heads,
        head_dim=c.get("head_dim") or c["hidden_size"] // heads,
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)), qk_norm=c.get("model_type") == "qwen3",
        dtype=str(c.get("dtype") or c.get("torch_dtype") or "float32"),
    )


def model_arch(model: ModelConfig, key: str) -> Arch:
    """The architecture of the model at ``model.path`` (``key`` names it in errors)."""
    config = Path(model.path) / "config.json"
    if config.is_file():
        return arch_from_config_json(config)
    known = QWEN3_ARCHS.get(Path(model.path).name.lower())
    if known is not None:
        return known
    if model.make_tiny_if_missing:
        t = model.tiny
        return Arch(Path(model.path).name, t.num_layers, t.hidden_size, t.intermediate_size, t.vocab_size,
                    t.num_heads, t.num_kv_heads, t.head_dim, tie_word_embeddings=True, dtype="float32")
    raise ValueError(f"{key}={model.path!r}: no config.json there and not one of the known architectures "
                     f"({', '.join(a.name for a in QWEN3_ARCHS.values())}); give a model directory")


@dataclass(frozen=True)
class ActorMemory:
    """The estimate for the actors of one kind, per GPU (bytes)."""

    actor: str
    count: int
    gpus: float
    """GPUs of each actor."""
    model: str
    params: int
    budget: float
    """What the actor may use on each GPU: the engine's gpu_memory_utilization share, or the GPU."""
    weights: float = 0.0
    grads: float = 0.0
    optimizer: float = 0.0
    reference: float = 0.0
    working: float = 0.0
    """Learner: gathered layers, checkpointed activations and logits of one micro-batch."""
    kv_cache: float = 0.0
    """Engines: what is left of the budget for the KV cache (an upper bound)."""
    kv_tokens: int = 0
    max_model_len: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.reference + self.working + self.kv_cache

    @property
    def fits(self) -> str:
        """``yes``, ``tight`` or ``NO``.  Learner: everything within the GPU (``NO`` otherwise).
        Engine: ``NO`` when its weights and one ``max_model_len`` sequence of KV cache exceed its
        share (vLLM refuses to start); ``tight`` when the cache's upper bound holds fewer than
        two such sequences (vLLM's activation peak and CUDA graphs, not estimated here, come out
        of it, so the engine may not start)."""
        if self.max_model_len:
            if self.kv_tokens < self.max_model_len:
                return "NO"
            return "tight" if self.kv_tokens < 2 * self.max_model_len else "yes"
        return "yes" if self.total <= self.budget else "NO"


def engine_memory(actor: str, count: int, gpus: float, model: ModelConfig, inference: InferenceConfig,
                  key: str, gpu_gib: float, dtype: str | None = None,
                  utilization: float | None = None) -> ActorMemory:
    """A vLLM engine's share of each of its GPUs (``dtype`` None: the checkpoint's own)."""
    arch = model_arch(model, key)
    dtype = dtype or arch.dtype
    nbytes, tp = DTYPE_BYTES[dtype], inference.tensor_parallel_size
    budget = (utilization or inference.gpu_memory_utilization) * gpu_gib * GIB
    weights = arch.params * nbytes / tp
    kv = max(0.0, budget - weights)
    tokens = int(kv // arch.kv_bytes_per_token(nbytes, tp))
    notes = [f"{dtype} weights, TP={tp}", f"KV {arch.kv_bytes_per_token(nbytes, tp) / 2**10:g} KiB/token/GPU"]
    return ActorMemory(actor, count, gpus, arch.name, arch.params, budget, weights=weights, kv_cache=kv,
                       kv_tokens=tokens, max_model_len=inference.max_model_len, notes=notes)


def learner_memory(actor: str, cfg: CastConfig, model: ModelConfig, key: str, gpu_gib: float) -> ActorMemory:
    """One FSDP rank of the learner training ``model``."""
    lr = cfg.learner
    arch = model_arch(model, key)
    ranks = lr.num_workers
    compute = 2 if cfg.policy.dtype != "float32" or lr.mixed_precision == "bf16" else 4
    lora = lr.lora.rank is not None
    trainable = arch.lora_params(lr.lora.rank, lr.lora.target_modules) if lora else arch.params
    weights = 4 * (arch.params + (trainable if lora else 0)) / ranks
    tokens = lr.max_tokens_per_micro_batch or lr.micro_batch_size * cfg.inference.max_model_len
    activations = tokens * arch.hidden_size * compute * arch.num_layers
    notes = [f"{ranks} FSDP ranks", f"{tokens} tokens/micro-batch"]
    if lora:
        notes.append(f"LoRA r={lr.lora.rank}: {trainable / 1e6:.1f}M trainable")
    if not lr.activation_checkpointing:  # every layer keeps all its activations: many times more
        notes.append("no activation checkpointing: working memory far above this estimate")
    working = 2 * arch.layer_params * compute + activations + tokens * arch.vocab_size * 4
    return ActorMemory(
        actor, ranks, lr.num_gpus_per_worker, arch.name, arch.params, gpu_gib * GIB,
        weights=weights, grads=4 * trainable / ranks, optimizer=8 * trainable / ranks,
        reference=4 * arch.params / ranks if cfg.algorithm.kl_coef > 0 and not lora else 0.0,
        working=working, notes=notes,
    )


def plan(cfg: CastConfig, gpu_gib: float = 80.0) -> list[ActorMemory]:
    """Per-actor memory estimates of ``cfg`` on GPUs of ``gpu_gib`` GiB, in the order the actors
    start; a model served outside the job (the LLM user's endpoint) comes last."""
    rows = [engine_memory("rollout (policy engine)", cfg.rollout.num_workers, cfg.rollout.num_gpus_per_worker,
                          cfg.policy, cfg.inference, "policy.path", gpu_gib, dtype=cfg.policy.dtype)]
    rows[0].notes.append(f"{rows[0].kv_tokens // cfg.rollout.episodes_in_flight:,} tokens per episode of "
                         f"rollout.episodes_in_flight={cfg.rollout.episodes_in_flight}")
    critic = cfg.critic
    if critic.backend != "rule" and critic.engine == "own":
        # served in critic.model.dtype (a trained critic's checkpoint holds float32 master weights)
        rows.append(engine_memory("critic service", critic.num_replicas, critic.num_gpus_per_replica, critic.model,
                                  critic.inference, "critic.model.path", gpu_gib, dtype=critic.model.dtype))
    teacher = cfg.teacher
    if (teacher.enabled or cfg.pipeline.collect_policy == "teacher") and teacher.inference.backend == "vllm":
        count = teacher.num_workers if cfg.pipeline.collect_policy == "teacher" else 1
        rows.append(engine_memory("teacher", count, teacher.num_gpus, teacher.model, teacher.inference,
                                  "teacher.model.path", gpu_gib, dtype=teacher.model.dtype))
    labeller = cfg.labeller
    if labeller.backend != "rules" and labeller.inference.backend == "vllm":
        rows.append(engine_memory("LLM verifier", 1, labeller.num_gpus, labeller.model, labeller.inference,
                                  "labeller.model.path", gpu_gib, dtype=labeller.model.dtype))
    rows.append(learner_memory("learner (policy)", cfg, cfg.policy, "policy.path", gpu_gib))
    if critic.backend == "trained":
        base = cfg.policy if cfg.pipeline.critic_base == "warmstart" else critic.model
        rows.append(learner_memory("learner (critic)", cfg, base, "critic.model.path", gpu_gib))
    user = cfg.user
    known = (Path(user.model.path) / "config.json").is_file() or Path(user.model.path).name.lower() in QWEN3_ARCHS
    if user.type == "llm" and user.inference.backend == "openai" and known:  # an endpoint's size may be unknown
        # the server's own max_model_len decides; a user turn sees the whole conversation, as long
        # as the policy's
        served = dataclasses.replace(user.inference, max_model_len=cfg.inference.max_model_len)
        row = engine_memory("user simulator (outside the job)", 1, user.inference.tensor_parallel_size, user.model,
                            served, "user.model.path", gpu_gib, utilization=VLLM_SERVE_UTILIZATION)
        row.notes.append(f"vllm serve's default utilization {VLLM_SERVE_UTILIZATION}, the policy's max_model_len")
        rows.append(row)
    return rows


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def _gib(n: float) -> str:
    return f"{n / GIB:.1f}" if n else "-"


PLAN_HEADER = ("actor", "actors x GPUs", "model", "params", "weights", "grads", "optimizer", "reference",
               "working", "KV cache", "total / budget", "fits", "notes")


def plan_rows(rows: list[ActorMemory]) -> list[list[str]]:
    """The table's cells (GiB per GPU), one list per actor kind."""
    out = []
    for r in rows:
        fits = r.fits
        if r.max_model_len:
            fits += f": {r.kv_tokens:,} tokens = {r.kv_tokens / r.max_model_len:.1f} x {r.max_model_len}"
        out.append([r.actor, f"{r.count} x {r.gpus:g}", r.model, _count(r.params), _gib(r.weights),
                    _gib(r.grads), _gib(r.optimizer), _gib(r.reference), _gib(r.working), _gib(r.kv_cache),
                    f"{r.total / GIB:.1f} / {r.budget / GIB:.1f}", fits, "; ".join(r.notes)])
    return out


def plan_markdown(rows: list[ActorMemory]) -> str:
    """The estimate as a Markdown table (GiB per GPU), as docs/reproduce.md shows it."""
    lines = ["| " + " | ".join(PLAN_HEADER) + " |", "|" + "---|" * len(PLAN_HEADER)]
    lines += ["| " + " | ".join(cells) + " |" for cells in plan_rows(rows)]
    return "\n".join(lines) + "\n"


def plan_text(rows: list[ActorMemory]) -> str:
    """The estimate as an aligned plain-text table (GiB per GPU)."""
    table = [list(PLAN_HEADER), *plan_rows(rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(PLAN_HEADER))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table) + "\n"


def not_fitting(rows: list[ActorMemory]) -> list[str]:
    """The actors whose estimate does not fit (``NO``) or may not (``tight``)."""
    return [f"{r.actor}: {r.fits}" for r in rows if r.fits != "yes"]



def layout_markdown(cfg: CastConfig, gpu_gib: float = 80.0) -> str:
    """What docs/reproduce.md shows per layout: the GPUs each kind of actor asks Ray for, the
    busiest stage's total, and :func:`plan_markdown`."""
    from cast_rl.config.resources import gpus_required

    need = gpus_required(cfg)
    gpus = ", ".join(f"{kind} {need[kind]:g}" for kind in ("rollout", "learner", "critic", "teacher"))
    head = (f"GPUs Ray gives the job's actors: {gpus}; at the busiest stage critic {need['critic']:g} + "
            f"max(rollout {need['rollout']:g} + learner {need['learner']:g}, teacher {need['teacher']:g}) = "
            f"{need['peak']:g}.  Estimate per GPU in GiB on {gpu_gib:g} GiB GPUs "
            f"(`cast-rl plan CONFIG --gpu-gib {gpu_gib:g} --markdown`):\n\n")
    return head + plan_markdown(plan(cfg, gpu_gib))
