"""specload.workload.config: defaults, TOML loading, validation messages, flag overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from specload.workload.config import (
    REFERENCE_LEVELS,
    Scenario,
    ScenarioError,
    apply_overrides,
    load_scenario,
    parse_levels,
    scenario_from_dict,
)

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def write(tmp_path: Path, text: str, name: str = "sc.toml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


# defaults ----------------------------------------------------------------------------------------


def test_defaults_match_reference() -> None:
    sc = Scenario()
    assert sc.levels == [1, 4, 16, 32, 64, 128]
    assert REFERENCE_LEVELS == [1, 4, 16, 32, 64, 128]
    assert sc.backend == "openai"
    assert sc.input_tokens == 1000
    assert sc.output_tokens == 1000
    assert sc.duration_s is None
    assert sc.warmup_requests == 0
    assert sc.shared_prefix_tokens == 0
    assert sc.temperature == 0.0


@pytest.mark.parametrize(
    ("c", "budget"), [(1, 4), (2, 4), (3, 6), (4, 8), (16, 32), (32, 64), (64, 128), (128, 256)]
)
def test_default_budget_is_reference_rule(c: int, budget: int) -> None:
    assert Scenario().budget(c) == budget


def test_budget_rounds_up_and_fixed_requests_win() -> None:
    assert Scenario(requests_per_user=1.5, min_requests=1).budget(3) == 5  # ceil(4.5)
    assert Scenario(requests=7).budget(128) == 7
    assert Scenario(requests=7).budget(1) == 7


def test_duration_makes_budget_none() -> None:
    assert Scenario(duration_s=30.0).budget(4) is None
    assert Scenario(duration_s=30.0, requests=5).budget(4) is None


def test_default_levels_not_shared_between_instances() -> None:
    a = Scenario()
    a.levels.append(999)
    assert Scenario().levels == [1, 4, 16, 32, 64, 128]
    assert REFERENCE_LEVELS == [1, 4, 16, 32, 64, 128]


def test_warmup_tokens() -> None:
    assert Scenario(output_tokens=300).warmup_tokens == 300
    assert Scenario(output_tokens=300, warmup_output_tokens=20).warmup_tokens == 20


# shipped scenario files --------------------------------------------------------------------------


def test_load_mtp_sweep() -> None:
    sc = load_scenario(str(SCENARIOS / "mtp-sweep.toml"))
    assert sc.name == "mtp-sweep"
    assert sc.backend == "openai"
    assert (sc.input_tokens, sc.output_tokens) == (1000, 1000)
    assert sc.levels == [1, 4, 16, 32, 64, 128]
    assert sc.warmup_requests == 1
    assert sc.warmup_tokens == 100
    assert sc.read_timeout_s == 900.0
    assert [sc.budget(c) for c in sc.levels] == [4, 8, 32, 64, 128, 256]


def test_load_smoke() -> None:
    sc = load_scenario(str(SCENARIOS / "smoke.toml"))
    assert sc.name == "smoke"
    assert (sc.input_tokens, sc.output_tokens) == (32, 16)
    assert sc.levels == [1, 2, 4]
    assert sc.read_timeout_s == 30.0
    assert [sc.budget(c) for c in sc.levels] == [4, 4, 8]


def test_load_demo() -> None:
    sc = load_scenario(str(SCENARIOS / "demo.toml"))
    assert sc.name == "demo"
    # The reference sweep's shape (levels, prompt, budgets), shorter outputs, SGLang for accept length.
    assert sc.input_tokens == 1000 and sc.output_tokens < 1000
    assert sc.levels == [1, 4, 16, 32, 64]  # 128 left out: the demo's two minutes; C=64 is past the cap
    assert (sc.budget(1), sc.budget(64)) == (4, 128)
    assert sc.backend == "sglang"


def test_load_full_file_with_every_kind_of_field(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
name = "x"
backend = "sglang"
model = "m"
input_tokens = 64
output_tokens = 8
levels = [2, 3]
requests = 5
requests_per_user = 3
duration_s = 10
pause_s = 1.5
shared_prefix_tokens = 16
temperature = 0.7
token_id_min = 10
token_id_max = 20
[extra_body]
top_p = 0.9
[extra_body.sampling_params]
top_k = 5
""",
    )
    sc = load_scenario(path)
    assert sc.backend == "sglang"
    assert sc.model == "m"
    assert sc.levels == [2, 3]
    assert sc.requests == 5
    assert sc.requests_per_user == 3.0 and isinstance(sc.requests_per_user, float)
    assert sc.duration_s == 10.0 and isinstance(sc.duration_s, float)
    assert sc.budget(2) is None
    assert sc.extra_body == {"top_p": 0.9, "sampling_params": {"top_k": 5}}
    assert sc.token_id_range == (10, 20)


def test_scenario_table_form_accepted(tmp_path: Path) -> None:
    path = write(tmp_path, '[scenario]\nname = "t"\nlevels = [1, 8]\ninput_tokens = 10\n')
    sc = load_scenario(path)
    assert (sc.name, sc.levels, sc.input_tokens) == ("t", [1, 8], 10)


def test_scenario_table_is_validated_too(tmp_path: Path) -> None:
    path = write(tmp_path, "[scenario]\nlevels = [0]\n")
    with pytest.raises(ScenarioError) as ei:
        load_scenario(path)
    assert path in str(ei.value) and "'levels'" in str(ei.value)


# validation: every error names the file and the field --------------------------------------------


@pytest.mark.parametrize(
    ("toml", "field"),
    [
        ("input_tokenz = 5", "input_tokenz"),
        ('levels = "x"', "levels"),
        ("levels = [0]", "levels"),
        ("levels = []", "levels"),
        ("levels = [1, -4]", "levels"),
        ("levels = [1, true]", "levels"),
        ("levels = [1.5]", "levels"),
        ("levels = 4", "levels"),
        ("input_tokens = -5", "input_tokens"),
        ("input_tokens = 0", "input_tokens"),
        ("input_tokens = 1.5", "input_tokens"),
        ('input_tokens = "100"', "input_tokens"),
        ("input_tokens = true", "input_tokens"),
        ("output_tokens = false", "output_tokens"),
        ("repeat = true", "repeat"),
        ("seed = -1", "seed"),
        ("warmup_requests = true", "warmup_requests"),
        ('backend = "foo"', "backend"),
        ("backend = 1", "backend"),
        ('model = ""', "model"),
        ("name = 3", "name"),
        ("requests = 0", "requests"),
        ("requests_per_user = 0", "requests_per_user"),
        ("requests_per_user = true", "requests_per_user"),
        ("duration_s = 0", "duration_s"),
        ('duration_s = "30"', "duration_s"),
        ("pause_s = -1", "pause_s"),
        ("temperature = nan", "temperature"),
        ("read_timeout_s = 0", "read_timeout_s"),
        ('extra_body = "x"', "extra_body"),
        ("shared_prefix_tokens = 1000", "shared_prefix_tokens"),
        ("input_tokens = 10\nshared_prefix_tokens = 11", "shared_prefix_tokens"),
        ("token_id_min = 5\ntoken_id_max = 5", "token_id_min"),
        ("token_id_min = 50\ntoken_id_max = 10", "token_id_max"),
    ],
)
def test_validation_error_names_file_and_field(tmp_path: Path, toml: str, field: str) -> None:
    path = write(tmp_path, toml + "\n")
    with pytest.raises(ScenarioError) as ei:
        load_scenario(path)
    msg = str(ei.value)
    assert msg.startswith(path + ":"), msg
    assert f"'{field}'" in msg, msg


def test_unknown_field_lists_known_fields(tmp_path: Path) -> None:
    path = write(tmp_path, "input_tokenz = 5\n")
    with pytest.raises(ScenarioError, match="unknown field 'input_tokenz'") as ei:
        load_scenario(path)
    assert "input_tokens" in str(ei.value).split("known fields:")[1]


def test_wrong_type_message_shows_expected_and_got(tmp_path: Path) -> None:
    path = write(tmp_path, 'levels = "x"\n')
    with pytest.raises(ScenarioError) as ei:
        load_scenario(path)
    assert "positive integers" in str(ei.value)
    assert "'x'" in str(ei.value)


def test_scenario_error_is_value_error() -> None:
    assert issubclass(ScenarioError, ValueError)


def test_bad_toml_syntax_names_file(tmp_path: Path) -> None:
    path = write(tmp_path, "levels = [1, 4\nname = \n")
    with pytest.raises(ScenarioError) as ei:
        load_scenario(path)
    assert str(ei.value).startswith(path + ":")
    assert "not valid TOML" in str(ei.value)


def test_missing_file_names_file(tmp_path: Path) -> None:
    path = str(tmp_path / "nope.toml")
    with pytest.raises(ScenarioError) as ei:
        load_scenario(path)
    assert str(ei.value).startswith(path + ":")
    assert "not found" in str(ei.value)


def test_scenario_from_dict_uses_source_name() -> None:
    with pytest.raises(ScenarioError, match=r"^here: field 'backend'"):
        scenario_from_dict({"backend": "foo"}, source="here")


def test_shared_prefix_just_below_input_is_fine() -> None:
    sc = scenario_from_dict({"input_tokens": 10, "shared_prefix_tokens": 9})
    assert sc.shared_prefix_tokens == 9


# levels strings and overrides --------------------------------------------------------------------


def test_parse_levels_forms() -> None:
    assert parse_levels("x", "1,4") == [1, 4]
    assert parse_levels("x", " 1, 4 ,16 ") == [1, 4, 16]
    assert parse_levels("x", [2, 3]) == [2, 3]
    for bad in ("", "1,x", "0", "1,-2", ","):
        with pytest.raises(ScenarioError, match="'levels'"):
            parse_levels("x", bad)


def test_apply_overrides_with_flag_strings() -> None:
    base = load_scenario(str(SCENARIOS / "smoke.toml"))
    out = apply_overrides(base, {"levels": "1,4", "input_tokens": 64, "duration_s": 12.5})
    assert out.levels == [1, 4]
    assert out.input_tokens == 64
    assert out.duration_s == 12.5
    assert out.budget(4) is None
    # The rest comes from the base, which is left untouched.
    assert out.output_tokens == 16 and out.name == "smoke"
    assert base.levels == [1, 2, 4] and base.input_tokens == 32 and base.duration_s is None


def test_apply_overrides_returns_copy_with_own_mutables() -> None:
    base = Scenario(extra_body={"a": {"b": 1}})
    out = apply_overrides(base, {"seed": 3})
    out.extra_body["a"]["b"] = 2
    out.levels.append(7)
    assert base.extra_body == {"a": {"b": 1}}
    assert base.levels == [1, 4, 16, 32, 64, 128]


def test_apply_overrides_validates_with_command_line_source() -> None:
    with pytest.raises(ScenarioError, match=r"^command line: field 'levels'"):
        apply_overrides(Scenario(), {"levels": "0,4"})
    with pytest.raises(ScenarioError, match=r"^command line: field 'input_tokens'"):
        apply_overrides(Scenario(), {"input_tokens": True})
    with pytest.raises(ScenarioError, match="unknown field 'nope'"):
        apply_overrides(Scenario(), {"nope": 1})


def test_apply_overrides_checks_whole_scenario() -> None:
    # Each field alone is fine; together the prefix is as long as the prompt.
    with pytest.raises(ScenarioError, match="'shared_prefix_tokens'"):
        apply_overrides(Scenario(shared_prefix_tokens=10), {"input_tokens": 10})
    with pytest.raises(ScenarioError, match="token_id_min"):
        apply_overrides(Scenario(), {"token_id_max": 1000})


def test_apply_overrides_none_clears_optional_fields() -> None:
    sc = apply_overrides(Scenario(requests=9, duration_s=5.0), {"requests": None, "duration_s": None})
    assert sc.requests is None and sc.duration_s is None
    assert sc.budget(16) == 32


def test_to_dict_round_trips() -> None:
    sc = Scenario(name="r", levels=[3], extra_body={"k": 1})
    assert scenario_from_dict(sc.to_dict()) == sc


@pytest.mark.parametrize("kind", ["directory", "not-utf8"])
def test_unreadable_scenario_file_names_file(tmp_path: Path, kind: str) -> None:
    if kind == "directory":
        path = str(tmp_path)
    else:
        path = str(tmp_path / "latin1.toml")
        Path(path).write_bytes(b'name = "caf\xe9"\n')
    with pytest.raises(ScenarioError) as ei:
        load_scenario(path)
    assert str(ei.value).startswith(path + ":")


def test_a_directory_named_like_a_builtin_scenario_does_not_hide_it(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`specload demo` run from a folder holding a `demo/` directory (its own results, say) must still
    find the built-in scenario 'demo', not try to read the directory."""
    (tmp_path / "demo").mkdir()
    monkeypatch.chdir(tmp_path)
    assert load_scenario("demo").name == "demo"
