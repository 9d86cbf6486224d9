"""Who may unlock the dashboard's actions: the operator token kept only as a salted hash (or given as one), wrong
tokens locked out per session and for the process, and operator names checked. AppTest drives the real pages over
a real run copy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from dashboard_app import assert_rendered, open_page, serve, unlock

from bedside.app.dashboard import registry
from bedside.app.dashboard.auth import FIRST_WAIT_S, FREE_TRIES, MAX_WAIT_S, Lockout, TokenFormatError, TokenHash

TOKEN = "correct horse battery"
LOCKED = "Too many wrong tokens: try again in"


@pytest.fixture(autouse=True)
def closed_desks() -> Iterator[None]:
    yield
    registry.close_all()


def sidebar_errors(app) -> list[str]:
    return [e.value for e in app.sidebar.error]


def test_the_process_keeps_only_a_salted_hash_of_the_token(tiny_faults: Path, monkeypatch) -> None:
    serve(tiny_faults, token=TOKEN)
    served = registry.desk()
    assert isinstance(served.operator_token, TokenHash)
    assert TOKEN not in repr(served) and TOKEN not in repr(registry._INSTALLED)
    assert served.can_act(TOKEN) and not served.can_act(TOKEN + " ")
    assert TokenHash.of(TOKEN).salt != TokenHash.of(TOKEN).salt  # salted: the same token never hashes the same


def test_the_token_may_be_configured_as_its_hash(tiny_faults: Path, monkeypatch) -> None:
    hashed = TokenHash.of(TOKEN).encoded()
    assert hashed.startswith("scrypt$16384$8$1$") and TOKEN not in hashed
    serve(tiny_faults, token=hashed)
    app = unlock(open_page("incidents"), "alice", hashed)  # the hash itself is no token
    assert sidebar_errors(app) == ["Wrong token."]
    app = unlock(open_page("incidents"), "alice", TOKEN)
    assert_rendered(app)
    assert app.session_state["operator"] == "alice"


def test_a_malformed_token_hash_is_one_clear_error_before_anything_is_served(tiny_faults: Path) -> None:
    with pytest.raises(TokenFormatError) as raised:
        serve(tiny_faults, token="scrypt$16384$8$zz")
    assert str(raised.value) == "the operator token hash must read scrypt$N$r$p$<salt hex>$<hash hex> (4 fields given)"


def test_repeated_wrong_tokens_lock_the_session_out_even_for_the_right_token(tiny_faults: Path, monkeypatch) -> None:
    serve(tiny_faults, token=TOKEN)
    app = open_page("incidents")
    for _ in range(FREE_TRIES):
        unlock(app, "mallory", "guess")
        assert sidebar_errors(app) == ["Wrong token."]
    unlock(app, "alice", TOKEN)
    [error] = sidebar_errors(app)
    assert error.startswith(LOCKED) and "operator" not in app.session_state


def test_wrong_tokens_from_many_sessions_lock_the_process_out(tiny_faults: Path, monkeypatch) -> None:
    serve(tiny_faults, token=TOKEN)
    for _ in range(FREE_TRIES):  # each guess from a new session, as a script would
        assert sidebar_errors(unlock(open_page("incidents"), "mallory", "guess")) == ["Wrong token."]
    app = unlock(open_page("incidents"), "alice", TOKEN)
    assert sidebar_errors(app)[0].startswith(LOCKED) and "operator" not in app.session_state


def test_the_lockout_doubles_up_to_its_cap_and_a_right_token_clears_it() -> None:
    lockout = Lockout()
    for _ in range(FREE_TRIES - 1):
        lockout.failed()
    assert lockout.wait_s() == 0
    lockout.failed()
    assert FIRST_WAIT_S / 2 < lockout.wait_s() <= FIRST_WAIT_S
    lockout.failed()
    assert FIRST_WAIT_S < lockout.wait_s() <= 2 * FIRST_WAIT_S
    for _ in range(20):
        lockout.failed()
    assert MAX_WAIT_S / 2 < lockout.wait_s() <= MAX_WAIT_S
    lockout.succeeded()
    assert lockout.wait_s() == 0 and lockout.failures == 0


def test_the_lockout_stays_at_its_cap_after_thousands_of_wrong_tokens() -> None:
    """Past 1,027 failures ``30 * 2**n`` no longer fits a float: the wait must still be set, at the cap."""
    lockout = Lockout()
    for _ in range(2000):
        lockout.failed()
    assert lockout.failures == 2000
    assert MAX_WAIT_S - 1 < lockout.wait_s() <= MAX_WAIT_S


@pytest.mark.parametrize(
    ("name", "error"),
    [
        pytest.param("a" * 65, "The name is 65 characters long: at most 64.", id="too long"),
        pytest.param(
            "alice\nroot",
            "The name holds control characters (U+000A): use letters, digits, spaces and punctuation.",
            id="a newline",
        ),
        pytest.param(
            "bob\u200b",
            "The name holds control characters (U+200B): use letters, digits, spaces and punctuation.",
            id="a zero-width space",
        ),
    ],
)
def test_an_operator_name_that_could_mislead_the_audit_trail_is_refused(
    tiny_faults: Path, monkeypatch, name: str, error: str
) -> None:
    serve(tiny_faults, token=TOKEN)
    app = unlock(open_page("incidents"), name, TOKEN)
    assert_rendered(app)
    assert sidebar_errors(app) == [error] and "operator" not in app.session_state
