"""The server's settings in groups: every setting in exactly one group, a settings file may nest them, and the
flat names of flags and SIMULSERVE_* variables keep working (and win over a file)."""
from __future__ import annotations

import dataclasses
import re

import pytest

from server.settings import GROUPS, ServerSettings, SettingsError, load_settings


def test_every_setting_is_in_exactly_one_group():
    grouped = [f.name for cls in GROUPS.values() for f in dataclasses.fields(cls)]
    assert sorted(grouped) == sorted(ServerSettings.model_fields)
    assert len(grouped) == len(set(grouped))


def test_groups_read_the_settings_and_are_frozen(monkeypatch):
    monkeypatch.delenv("SIMULSERVE_MAX_STREAMS", raising=False)
    s = load_settings(max_streams=7, max_batch=3, api_keys=["k"])
    assert s.limits.max_streams == 7 and s.batching.max_batch == 3 and s.auth.api_keys == ["k"]
    assert s.headroom.delay_budget_ms == s.delay_budget_ms and s.transport.port == s.port
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.limits.max_streams = 9


def test_a_settings_file_may_nest_and_flat_names_win(tmp_path, monkeypatch):
    f = tmp_path / "server.yaml"
    f.write_text("limits:\n  max_streams: 7\n  rate_limit: 5\nbatching: {max_batch: 3}\nport: 9001\n")
    monkeypatch.delenv("SIMULSERVE_MAX_STREAMS", raising=False)
    s = load_settings(f)
    assert (s.limits.max_streams, s.limits.rate_limit, s.batching.max_batch, s.transport.port) == (7, 5, 3, 9001)
    assert load_settings(f, max_streams=9).limits.max_streams == 9          # a flag
    monkeypatch.setenv("SIMULSERVE_MAX_STREAMS", "11")
    assert load_settings(f).limits.max_streams == 11                        # a variable


def test_a_nested_name_outside_its_group_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("SIMULSERVE_MAX_STREAMS", raising=False)
    f = tmp_path / "server.yaml"
    f.write_text("limits:\n  max_batch: 3\n")
    with pytest.raises(SettingsError, match="limits.max_batch: no such setting in limits"):
        load_settings(f)
    f.write_text("limits: 3\n")
    with pytest.raises(SettingsError, match="a group of settings takes a mapping"):
        load_settings(f)


def test_a_bad_value_is_one_line_naming_the_setting_its_flag_and_the_value():
    """pydantic's own text named an internal class (_Settings) and a web page, over four lines."""
    with pytest.raises(SettingsError) as e:
        load_settings(max_batch=0, delay_budget_ms=-5.0)
    text = str(e.value)
    assert "\n" not in text and "_Settings" not in text and "pydantic.dev" not in text
    assert "max_batch (--max-batch): Input should be greater than or equal to 1, got 0" in text
    assert "delay_budget_ms (--delay-budget-ms): Input should be greater than 0, got -5.0" in text
    for bad, line in (({"idle_timeout_s": 0}, "idle_timeout_s (--idle-timeout): "),    # flags named otherwise
                      ({"share_peers": "nope"}, "share_peers (--share-peer): share peer 'nope': expected HOST:PORT"),
                      ({"api_keys": ["k", " "]}, "api_keys (--api-key): an API key is empty")):
        with pytest.raises(SettingsError, match=re.escape(line)):
            load_settings(**bad)
