"""What a pipeline instance asks of the network between its nodes.

vLLM's pipeline stages hand each token's hidden state and residual to the next stage
(``IntermediateTensors`` with ``hidden_states`` and ``residual``, each ``hidden_size``
wide, in the activations' dtype), so every stage boundary carries
``2 x hidden_size x dtype bytes`` per token, prefill and decode alike; with TP > 1 the
ranks split that payload, the boundary's total is the same. The sampled tokens go back
from the last stage to the first: a few bytes, but one more trip per step.

Two demands follow, per link between consecutive members:
- sustained: the bytes per token times the instance's token rate (prefill + decode),
  kept under half the link so bursts and the fleet's other traffic fit;
- per decode step: every sequence's next token crosses each boundary in turn, then the
  sampled tokens come back (``PP`` trips). The network may take ``share`` of the target
  time per output token (TPOT); each trip gets an equal part of it, half for the
  round-trip latency and half for moving one full step (``max_num_seqs`` tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Tensors a stage hands the next per token: hidden_states and residual.
TENSORS_PER_BOUNDARY = 2
#: The part of the time per output token the network may take.
NETWORK_SHARE = 0.10
#: A link kept at most this busy on average.
MAX_LINK_UTILIZATION = 0.5


@dataclass(frozen=True)
class PipelineNetwork:
    stages: int
    hidden_size: int
    dtype_bytes: int
    max_num_seqs: int
    prefill_rate: float  # tokens/s per instance
    decode_rate: float
    tpot_ms: float

    @property
    def bytes_per_token(self) -> int:
        return TENSORS_PER_BOUNDARY * self.hidden_size * self.dtype_bytes

    @property
    def sustained_bytes_per_s(self) -> float:
        return self.bytes_per_token * (self.prefill_rate + self.decode_rate)

    @property
    def decode_step_bytes(self) -> int:
        return self.bytes_per_token * self.max_num_seqs

    @property
    def trip_budget_s(self) -> float:
        """The time one trip (boundary, or the tokens' way back) may take."""
        return NETWORK_SHARE * self.tpot_ms / 1000 / self.stages

    @property
    def min_bandwidth_bytes_per_s(self) -> float:
        by_step = self.decode_step_bytes / (self.trip_budget_s / 2)
        return max(by_step, self.sustained_bytes_per_s / MAX_LINK_UTILIZATION)

    def to_dict(self) -> dict[str, Any]:
        return {
            "boundaries": self.stages - 1,
            "bytes_per_token": self.bytes_per_token,
            "prefill_tokens_per_s": self.prefill_rate,
            "decode_tokens_per_s": self.decode_rate,
            "tpot_ms": self.tpot_ms,
            "sustained_gbit_s": gbit(self.sustained_bytes_per_s),
            "decode_step_mib": round(self.decode_step_bytes / 2**20, 3),
            "min_bandwidth_gbit_s": gbit(self.min_bandwidth_bytes_per_s),
            # half a trip's time for the latency: a one-way latency of half the round trip
            "max_rtt_ms": round(self.trip_budget_s * 1000, 3),
            "network_share": NETWORK_SHARE,
        }


def gbit(bytes_per_s: float) -> float:
    return round(bytes_per_s * 8 / 1e9, 3)
