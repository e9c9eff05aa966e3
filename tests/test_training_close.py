"""The training loop's promise to a Strategy (parallel/common/training.py): close() comes last,
always, after finish(), the final evaluation and the gathered state; finish() only on success."""

from __future__ import annotations

import pytest

from parallel.common import training
from parallel.dp.trainer import DataParallel

HOOKS = ("build_model", "make_optimizer", "start", "before_step", "after_backward", "sum_over_ranks", "comm_s",
         "full_state", "finish", "close")


class Recording(DataParallel):
    """Plain data parallelism on one process, noting every hook the loop calls; after close() a
    hook fails, as one that needs the threads close() stopped would."""

    def __init__(self, config: training.Config, fail_in_step: bool = False) -> None:
        super().__init__(config)
        self.calls: list[str] = []
        self.fail_in_step = fail_in_step
        for name in HOOKS:
            setattr(self, name, self._noting(name, getattr(self, name)))

    def _noting(self, name, hook):
        def noted(*args, **kwargs):
            if "close" in self.calls:
                raise RuntimeError(f"{name}() called after close()")
            self.calls.append(name)
            if name == "after_backward" and self.fail_in_step:
                raise RuntimeError("a step failed")
            return hook(*args, **kwargs)

        return noted


def config() -> training.Config:
    return training.Config(world_size=1, epochs=1, batch_size=64, hidden=(8,), train_limit=128, return_state=True)


def test_close_is_the_last_call_after_finish_and_the_final_evaluation():
    how = Recording(config())
    result = training.train(config(), how)
    assert how.calls.count("close") == 1 and how.calls[-1] == "close", how.calls
    # after the last epoch: finish, the final evaluation's sum, the state for the caller, then close
    assert how.calls[-4:] == ["finish", "sum_over_ranks", "full_state", "close"], how.calls
    assert 0.0 <= result["final_accuracy"] <= 1.0 and set(result["state"]) == {"0.weight", "0.bias", "1.weight",
                                                                                "1.bias"}


def test_a_failed_step_still_closes_and_skips_finish():
    how = Recording(config(), fail_in_step=True)
    with pytest.raises(RuntimeError, match="a step failed"):
        training.train(config(), how)
    assert how.calls[-1] == "close" and "finish" not in how.calls, how.calls
