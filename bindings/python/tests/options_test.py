"""Python's keywords against the library's option table
(fsdp2.option_schema(), fsdp2_options_schema in fsdp2.h): FSDP2Strategy(),
Optimizer() and training_step() take every option as a keyword with the
table's default and document it, and every keyword reaches the library's
checks."""

import inspect
import sys

import pytest

import fsdp2

SCHEMA = fsdp2.option_schema()


def keywords(function):
    return {name: p for name, p in inspect.signature(function).parameters.items()
            if name not in ("self", "batch", "batch_idx", "loader")}


@pytest.mark.parametrize("function, section", [
    (fsdp2.FSDP2Strategy.__init__, "strategy"),
    (fsdp2.Optimizer.__init__, "optimizer"),
    (fsdp2.FSDP2Strategy.training_step, "step"),
    (fsdp2.FSDP2Strategy.training_step_loader, "step"),
])
def test_every_option_is_a_keyword_with_the_tables_default(function, section):
    rows = SCHEMA[section]
    assert rows, section
    params = keywords(function)
    for row in rows:
        assert row["name"] in params, f"{function.__qualname__} lacks the option {row['name']}"
        assert params[row["name"]].default == row["default"], (
            f"{function.__qualname__}: {row['name']} defaults to {params[row['name']].default!r}, "
            f"the library's table to {row['default']!r}")
        assert f"\n- {row['name']}={row['default']!r}" in inspect.getdoc(function), (
            f"{function.__qualname__}'s docstring lacks {row['name']}")
    assert set(params) == {row["name"] for row in rows}, "a keyword the table does not have"


def test_every_default_given_explicitly_is_accepted():
    defaults = {row["name"]: row["default"] for row in SCHEMA["strategy"]}
    fsdp2.FSDP2Strategy(**defaults).close()
    fsdp2.Optimizer(**{row["name"]: row["default"] for row in SCHEMA["optimizer"]})


def test_each_options_check_runs_at_the_keyword():
    with pytest.raises(fsdp2.InvalidArgumentError, match="forward_prefetch must be 0 or more"):
        fsdp2.FSDP2Strategy(forward_prefetch=-7)
    with pytest.raises(fsdp2.InvalidArgumentError, match="lr must be positive"):
        fsdp2.Optimizer(lr=0.0)
    with pytest.raises(fsdp2.InvalidArgumentError, match='unknown option "clip"'):
        fsdp2.FSDP2Strategy().training_step([], 0, clip=1.0)
    with pytest.raises(fsdp2.InvalidArgumentError, match="accumulate_grad_batches must be at least 1"):
        fsdp2.FSDP2Strategy().training_step([], 0, accumulate_grad_batches=0)


def test_lightnings_strategy_names_set_their_options(monkeypatch):
    """fsdp2.strategy("fsdp_cpu_offload") is FSDP2Strategy(cpu_offload=True):
    what reaches the library is the name's options, then the caller's."""
    import json
    from fsdp2 import _strategy
    sent = []
    real = _strategy._c.fsdp2_strategy_create_from_json

    def record(text):
        sent.append(json.loads(text))
        return real(text)

    monkeypatch.setattr(_strategy._c, "fsdp2_strategy_create_from_json", record)
    with fsdp2.strategy("fsdp_cpu_offload"):
        pass
    assert sent[-1] == {"cpu_offload": True}
    with fsdp2.strategy("fsdp_cpu_offload", cpu_offload=False, seed=3):
        pass
    assert sent[-1] == {"cpu_offload": False, "seed": 3}
    with fsdp2.strategy():
        pass
    assert sent[-1] == {}
    with pytest.raises(fsdp2.InvalidArgumentError, match="fsdp_cpu_offload"):
        fsdp2.strategy("ddp")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-p", "no:cacheprovider"]))
