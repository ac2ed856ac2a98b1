"""The seed streams: deterministic, independent per purpose, and extending."""

from __future__ import annotations

import pytest

from sim_scenes.seeds import episode_seeds, next_episode_seed
from sim_scenes.touch import SceneError


def test_seed_streams_are_deterministic_disjoint_and_extend() -> None:
    collect = episode_seeds(0, 500, "collect")
    evaluate = episode_seeds(0, 500, "eval")
    assert collect == episode_seeds(0, 500, "collect")
    assert not set(collect) & set(evaluate)
    assert episode_seeds(0, 100, "collect") == collect[:100]
    assert episode_seeds(1, 100, "collect") != collect[:100]
    with pytest.raises(SceneError, match="unknown seed purpose"):
        episode_seeds(0, 1, "training")


def test_seed_streams_keep_their_values() -> None:
    """Cached datasets and stored evaluation outcomes are keyed on the episodes these seeds
    draw: the streams must not change under them."""
    assert episode_seeds(0, 3, "eval") == [
        8489715751296615795,
        7760206288644978005,
        2183170420669903750,
    ]
    assert episode_seeds(7, 2, "collect") == [846042175861174123, 3940009678385287239]
    assert next_episode_seed(5, 1) == 3767054407
    assert next_episode_seed(123, 4) == 404593565
