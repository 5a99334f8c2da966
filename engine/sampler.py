"""Sampling one token per row of logits: greedy, temperature, top-k, top-p, per-request seed.

Random rows are sampled with the exponential race: argmax(probs / q) with
q ~ Exponential(1) picks token i with probability probs[i]. A request with a
seed draws its q from a generator seeded by (seed, tokens generated so far),
so its tokens do not depend on what else is in the batch; the other rows draw
from the sampler's own generator.

SamplingParams.validate keeps bad values out; the sampler still never fails on
one: a temperature under GREEDY_BELOW (or NaN) is greedy, top-k is capped at
the vocabulary, and top-p keeps at least the most likely token.
"""
from __future__ import annotations

import torch

from engine.sampling_params import GREEDY_BELOW
from engine.scheduler_output import ScheduledRequest


class Sampler:
    def __init__(self, seed: int):
        self.seed = seed
        self.generator: torch.Generator | None = None    # made on the logits' device at first use

    def sample(self, logits: torch.Tensor, requests: list[ScheduledRequest]) -> list[int]:
        """logits [N, V] float32, one row per request; returns N token ids."""
        if logits.dim() != 2 or logits.shape[0] != len(requests):
            raise ValueError(f"sample() got logits of shape {tuple(logits.shape)} for {len(requests)} requests")
        greedy_tokens = logits.argmax(dim=-1)
        greedy = [_is_greedy(r) for r in requests]
        if all(greedy):
            return greedy_tokens.tolist()

        device = logits.device
        temperatures = torch.tensor([1.0 if g else r.temperature for g, r in zip(greedy, requests)],
                                    device=device)
        logits = logits / temperatures[:, None]
        if any(r.top_k > 0 or r.top_p < 1 for r in requests):
            logits = _apply_top_k_top_p(logits, requests)
        probs = logits.softmax(dim=-1)
        random_tokens = (probs / self._exponential_noise(probs, requests)).argmax(dim=-1)

        return torch.where(torch.tensor(greedy, device=device), greedy_tokens, random_tokens).tolist()

    def _exponential_noise(self, probs: torch.Tensor, requests: list[ScheduledRequest]) -> torch.Tensor:
        if self.generator is None or self.generator.device != probs.device:
            self.generator = torch.Generator(probs.device).manual_seed(self.seed)
        noise = torch.empty_like(probs).exponential_(generator=self.generator)
        for row, request in enumerate(requests):
            if request.seed is not None:
                seed = hash((request.seed, request.num_output_tokens)) & 0xFFFF_FFFF_FFFF_FFFF
                generator = torch.Generator(probs.device).manual_seed(seed)
                noise[row].exponential_(generator=generator)
        return noise.clamp_(min=torch.finfo(noise.dtype).tiny)   # a draw of exactly 0 would give 0/0


def _is_greedy(request: ScheduledRequest) -> bool:
    return not request.temperature >= GREEDY_BELOW    # NaN too: greedy rather than garbage


def _apply_top_k_top_p(logits: torch.Tensor, requests: list[ScheduledRequest]) -> torch.Tensor:
    """Set to -inf every logit outside the row's top-k, then outside its top-p nucleus
    (the smallest set of most likely tokens whose probabilities sum to at least top_p)."""
    vocab_size = logits.shape[-1]
    top_k = torch.tensor([min(r.top_k, vocab_size) if r.top_k > 0 else vocab_size for r in requests],
                         device=logits.device)
    top_p = torch.tensor([r.top_p for r in requests], device=logits.device)
    sorted_logits, order = logits.sort(dim=-1, descending=True)

    rank = torch.arange(vocab_size, device=logits.device)
    sorted_logits = sorted_logits.masked_fill(rank[None, :] >= top_k[:, None], float("-inf"))

    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    outside = (mass_before >= top_p[:, None]) & (rank[None, :] > 0)
    sorted_logits = sorted_logits.masked_fill(outside, float("-inf"))

    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
