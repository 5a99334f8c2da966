"""Sampler: greedy, top-k, top-p, and seeded sampling independent of the batch."""
import pytest
import torch

from engine.model.sampler import Sampler
from engine.scheduler_output import RequestSampling

VOCAB = 50


def make_request(temperature=1.0, top_k=0, top_p=1.0, seed=None, num_output_tokens=0):
    return RequestSampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                           num_output_tokens=num_output_tokens)


def random_logits(rows, seed=0):
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax_and_top_k_1_is_greedy():
    logits = random_logits(4)
    argmax = logits.argmax(dim=-1).tolist()
    sampler = Sampler(seed=0)
    assert sampler.sample(logits, [make_request(temperature=0)] * 4).tolist() == argmax
    assert sampler.sample(logits, [make_request(top_k=1)] * 4).tolist() == argmax
    mixed = [make_request(temperature=0), make_request(temperature=2.0), make_request(temperature=0),
             make_request(top_k=1, temperature=5.0)]
    tokens = sampler.sample(logits, mixed).tolist()
    assert [tokens[0], tokens[2], tokens[3]] == [argmax[0], argmax[2], argmax[3]]


def test_seeded_requests_repeat_and_do_not_depend_on_the_batch():
    logits = random_logits(3)

    def seeded_run(sampler_seed, batch_of_three):
        sampler, tokens = Sampler(seed=sampler_seed), []
        for n in range(10):
            seeded = make_request(seed=7, num_output_tokens=n)
            if batch_of_three:
                tokens.append(sampler.sample(logits, [make_request(), seeded, make_request(top_p=0.5)]).tolist()[1])
            else:
                tokens.append(sampler.sample(logits[1:2], [seeded]).tolist()[0])
        return tokens

    alone = seeded_run(0, batch_of_three=False)
    assert seeded_run(1, batch_of_three=False) == alone     # the sampler's own seed does not matter
    assert seeded_run(3, batch_of_three=True) == alone
    assert len(set(alone)) > 1                               # each position draws afresh


def test_unseeded_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1] + [1e-9] * (VOCAB - 3)]))
    sampler = Sampler(seed=0)
    counts = torch.bincount(torch.tensor([sampler.sample(logits, [make_request()]).tolist()[0] for _ in range(2000)]),
                            minlength=VOCAB)
    assert counts[3:].sum() == 0
    assert abs(counts[0] / 2000 - 0.7) < 0.05 and abs(counts[1] / 2000 - 0.2) < 0.05


def test_top_p_and_top_k_keep_only_the_head_of_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05] + [0.0] * (VOCAB - 4))
    logits = torch.log(probs.clamp(min=1e-12)).expand(300, VOCAB)
    sampler = Sampler(seed=0)
    top_p = sampler.sample(logits, [make_request(top_p=0.75)] * 300).tolist()
    assert set(top_p) == {0, 1}                    # 0.5 + 0.3 reaches 0.75
    top_k = sampler.sample(logits, [make_request(top_k=3)] * 300).tolist()
    assert set(top_k) == {0, 1, 2}
    both = sampler.sample(logits, [make_request(top_k=3, top_p=0.6)] * 300).tolist()
    assert set(both) == {0, 1}


def test_mismatched_rows_are_a_clear_error():
    with pytest.raises(ValueError, match="for 1 requests"):
        Sampler(seed=0).sample(random_logits(2), [make_request()]).tolist()


def test_values_that_slipped_past_validation_neither_fail_nor_give_garbage():
    logits = random_logits(5)
    argmax = logits.argmax(dim=-1).tolist()
    rows = [make_request(temperature=1e-300), make_request(temperature=float("nan")),
            make_request(top_p=0.0), make_request(top_p=-1.0, top_k=2**70),
            make_request(top_k=2**70, seed=2**70)]
    tokens = Sampler(seed=0).sample(logits, rows).tolist()
    assert tokens[:4] == argmax[:4]      # greedy, and top-p keeps the most likely token
    assert 0 <= tokens[4] < VOCAB


def test_random_rows_follow_the_distribution_across_blocks():
    """The inverse CDF finds a block of tokens, then the token in it: mass at both edges of
    a block and in the last one, and nothing ever where the weight is 0."""
    probs = torch.zeros(1024)
    probs[[0, 255, 256, 1023]] = torch.tensor([0.5, 0.2, 0.2, 0.1])
    logits = torch.log(probs).expand(4000, 1024)
    tokens = Sampler(seed=0).sample(logits, [make_request()] * 4000).tolist()
    counts = torch.bincount(torch.tensor(tokens), minlength=1024).float() / 4000
    assert set(tokens) == {0, 255, 256, 1023}
    assert torch.allclose(counts[[0, 255, 256, 1023]], probs[[0, 255, 256, 1023]], atol=0.03)
