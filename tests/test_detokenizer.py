"""A request's text as its tokens come: the byte tokenizer makes every byte a token,
so a character of 2 to 4 bytes comes over as many steps; smollm2's GGUF tokenizer
is the embedded model's own."""
from __future__ import annotations

import pytest
from tokenizers import decoders

from engine.core.detokenizer import Detokenizer
from engine.model.loader import resolve_model
from engine.model.tokenizer import Tokenizer

pytestmark = pytest.mark.unit

TEXT = "unicode: café, naïve, 日本語, emoji 🙂 and 🇫🇷; done"


def stream(backend, ids: list[int], stops: list[str] = (), per_step: int = 1,
           finish_at: int | None = None) -> tuple[Detokenizer, list[str], int | None]:
    """Feeds ids per_step at a time, the last step finished; (the detokenizer, what
    each step released, where a stop string began)."""
    detokenizer = Detokenizer(backend, list(stops))
    released, stop_at = [], None
    end = len(ids) if finish_at is None else finish_at
    for start in range(0, end, per_step):
        step = ids[start:min(start + per_step, end)]
        text, stop_at = detokenizer.add(step, finished=start + per_step >= end)
        released.append(text)
        if stop_at is not None:
            break
    return detokenizer, released, stop_at


@pytest.fixture(scope="module")
def smollm2_backend():
    return resolve_model("smollm2-135m").tokenizer().backend


@pytest.mark.parametrize("per_step", [1, 3])
def test_streamed_text_is_the_whole_decode_and_no_step_splits_a_character(per_step):
    backend = Tokenizer.byte_level().backend
    ids = list(TEXT.encode())
    detokenizer, released, _ = stream(backend, ids, per_step=per_step)
    assert detokenizer.text == "".join(released) == backend.decode(ids) == TEXT
    assert not any("\ufffd" in text for text in released)
    assert detokenizer.token_ids == ids


def test_the_embedded_models_tokenizer_streams_its_whole_decode(smollm2_backend):
    ids = smollm2_backend.encode(TEXT * 3, add_special_tokens=False).ids
    detokenizer, released, _ = stream(smollm2_backend, ids)
    assert detokenizer.text == "".join(released) == smollm2_backend.decode(ids)


def test_a_request_that_ends_inside_a_character_keeps_its_bytes_as_the_decode_does():
    backend = Tokenizer.byte_level().backend
    ids = list("ok 🙂".encode())[:-2]                   # two of the emoji's four bytes
    detokenizer, released, _ = stream(backend, ids)
    assert released[-1] == detokenizer.text[len("ok "):] == backend.decode(ids)[len("ok "):]
    assert detokenizer.text.endswith("\ufffd")


def test_a_stop_string_cuts_the_text_and_is_never_streamed():
    backend = Tokenizer.byte_level().backend
    ids = list("say STOP now".encode())
    detokenizer, released, stop_at = stream(backend, ids, stops=["STOP"])
    assert stop_at == len("say ")
    assert detokenizer.text == "".join(released) == "say "
    assert "S" not in "".join(released)


def test_a_stop_string_across_a_character_split_over_steps():
    backend = Tokenizer.byte_level().backend
    ids = list("a 日本語 b".encode())
    detokenizer, released, stop_at = stream(backend, ids, stops=["本語"])
    assert (detokenizer.text, "".join(released), stop_at) == ("a 日", "a 日", 3)


def test_special_tokens_are_skipped():
    tokenizer = Tokenizer.byte_level()
    ids = tokenizer.encode("hi") + [tokenizer.eos_token_ids[0]]
    detokenizer, released, _ = stream(tokenizer.backend, ids)
    assert detokenizer.text == "".join(released) == "hi"


def test_a_decoder_that_rewrites_earlier_text_goes_on_from_each_refused_token():
    """The stream refuses a decoder whose text changes behind it (here "ab" becomes
    "X" once the b comes): the request goes on, on a new stream from that token, so
    no step fails, and what it streams still adds up to its text."""
    backend = Tokenizer.byte_level().backend
    backend.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Replace("ab", "X")])
    ids = list("cab, cab".encode())
    assert backend.decode(ids) == "cX, cX"
    detokenizer, released, _ = stream(backend, ids)
    assert detokenizer.text == "".join(released) == "cab, cab"
