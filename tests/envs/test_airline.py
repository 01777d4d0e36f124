"""The airline tools on hand-worked examples: prices, payments, refunds, ids and source quirks.

Small made-up databases give numbers that can be checked by hand; the benchmark database (read
from ../shared/benchmarks, skipped when absent) checks the gold actions of all 50 test tasks.
The differential comparison with tau-bench's own code is in ``test_fuzz_airline.py``.

Run: .venv/bin/python -m pytest tests/envs/test_airline.py -q
"""

from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from cast_rl.envs.core import ToolEnv, load_domain_data
from cast_rl.envs.db import Database
from cast_rl.envs.domain import get_domain, tool_name
from cast_rl.envs.domains.airline import (
    SPEC,
    BookReservation,
    CancelReservation,
    GetReservationDetails,
    SearchOnestopFlight,
    SendCertificate,
    UpdateReservationBaggages,
    UpdateReservationFlights,
    UpdateReservationPassengers,
)
from cast_rl.envs.types import RESPOND, Action

DAY = "2024-05-20"
ALICE = {"first_name": "Alice", "last_name": "Ray", "dob": "1980-01-01"}
BOB = {"first_name": "Bob", "last_name": "Ray", "dob": "1982-02-02"}


def _on_date(economy: int, business: int, seats: int = 5) -> dict[str, Any]:
    return {
        "status": "available",
        "available_seats": {"basic_economy": seats, "economy": seats, "business": seats},
        "prices": {"basic_economy": economy // 2, "economy": economy, "business": business},
    }


def small_tables() -> dict[str, Any]:
    """Two flights AAA->BBB->CCC, one user with every kind of payment, one 2-passenger booking."""
    return {
        "flights": {
            "F1": {
                "flight_number": "F1",
                "origin": "AAA",
                "destination": "BBB",
                "scheduled_departure_time_est": "20:00:00",
                "scheduled_arrival_time_est": "01:00:00+1",
                "dates": {
                    DAY: _on_date(100, 150, seats=2),
                    "2024-05-01": _on_date(10, 20),
                    "2024-05-21": {"status": "cancelled"},
                },
            },
            "F2": {
                "flight_number": "F2",
                "origin": "BBB",
                "destination": "CCC",
                "scheduled_departure_time_est": "09:00:00",
                "scheduled_arrival_time_est": "10:00:00",
                "dates": {
                    DAY: _on_date(200, 300),
                    "2024-05-21": _on_date(220, 330),
                    "2024-05-01": _on_date(5, 6),
                    "2024-05-2": _on_date(1, 2),
                },
            },
        },
        "reservations": {
            "R1": {
                "reservation_id": "R1",
                "user_id": "u1",
                "origin": "AAA",
                "destination": "BBB",
                "flight_type": "one_way",
                "cabin": "economy",
                "flights": [
                    {
                        "origin": "AAA",
                        "destination": "BBB",
                        "flight_number": "F1",
                        "date": DAY,
                        "price": 100,
                    }
                ],
                "passengers": [ALICE, BOB],
                "payment_history": [{"payment_id": "gift_card_1", "amount": 200}],
                "created_at": "2024-05-01T00:00:00",
                "total_baggages": 1,
                "nonfree_baggages": 0,
                "insurance": "no",
            },
        },
        "users": {
            "u1": {
                "payment_methods": {
                    "gift_card_1": {"source": "gift_card", "amount": 100, "id": "gift_card_1"},
                    "certificate_1": {"source": "certificate", "amount": 50, "id": "certificate_1"},
                    "credit_card_1": {
                        "source": "credit_card",
                        "brand": "visa",
                        "id": "credit_card_1",
                    },
                },
                "reservations": ["R1"],
            },
        },
    }


@pytest.fixture
def base() -> Database:
    return Database(small_tables())


@pytest.fixture
def db(base: Database) -> Database:
    return base.fork()


def _booking(**changes: Any) -> dict[str, Any]:
    kwargs = {
        "user_id": "u1",
        "origin": "AAA",
        "destination": "CCC",
        "flight_type": "one_way",
        "cabin": "economy",
        "flights": [{"flight_number": "F2", "date": DAY}],
        "passengers": [ALICE],
        "payment_methods": [{"payment_id": "credit_card_1", "amount": 200}],
        "total_baggages": 0,
        "nonfree_baggages": 0,
        "insurance": "no",
    }
    kwargs.update(changes)
    return kwargs


def _gift_card(db: Database) -> Any:
    return db["users"]["u1"]["payment_methods"]["gift_card_1"]["amount"]


# -- the domain spec ----------------------------------------------------------------------------


def test_spec_matches_tool_schemas(benchmarks_dir: Path) -> None:
    schemas = json.loads((benchmarks_dir / "airline" / "tools.json").read_text())
    assert get_domain("airline") is SPEC
    assert [tool_name(tool) for tool in SPEC.tools] == [s["function"]["name"] for s in schemas]
    for tool, schema in zip(SPEC.tools, schemas, strict=True):
        params = list(inspect.signature(tool.invoke).parameters)
        assert params == ["data", *schema["function"]["parameters"]["properties"]], tool
    assert SPEC.terminate_tools == ("transfer_to_human_agents",)
    assert SPEC.write_tools <= set(SPEC.tool_map)
    assert "book_reservation" in SPEC.write_tools and "search_direct_flight" not in SPEC.write_tools


def test_bad_arguments_raise_the_source_type_errors(db: Database) -> None:
    with pytest.raises(TypeError) as missing:
        UpdateReservationPassengers.invoke(db, reservation_id="R1")
    assert str(missing.value) == (
        "UpdateReservationPassengers.invoke() missing 1 required positional argument: 'passengers'"
    )
    with pytest.raises(TypeError) as extra:
        CancelReservation.invoke(db, reservation_id="R1", reason="x")
    assert (
        str(extra.value) == "CancelReservation.invoke() got an unexpected keyword argument 'reason'"
    )


# -- book_reservation ---------------------------------------------------------------------------


def test_book_prices_charges_and_stores(db: Database, base: Database) -> None:
    # 2 passengers x F2 200 + insurance 2 x 30 + 1 bag x 50 = 510
    kwargs = _booking(
        flights=[{"flight_number": "F2", "date": DAY}],
        passengers=[ALICE, BOB],
        payment_methods=[
            {"payment_id": "gift_card_1", "amount": 90},
            {"payment_id": "certificate_1", "amount": 50},
            {"payment_id": "credit_card_1", "amount": 370},
        ],
        insurance="yes",
        nonfree_baggages=1,
        total_baggages=3,
    )
    caller = copy.deepcopy(kwargs)
    out = json.loads(BookReservation.invoke(db, **kwargs))
    assert out["reservation_id"] == "HATHAT" and out["created_at"] == "2024-05-15T15:00:00"
    assert out["flights"] == [
        {"flight_number": "F2", "date": DAY, "price": 200, "origin": "BBB", "destination": "CCC"}
    ]
    assert list(out) == [
        "reservation_id",
        "user_id",
        "origin",
        "destination",
        "flight_type",
        "cabin",
        "flights",
        "passengers",
        "payment_history",
        "created_at",
        "total_baggages",
        "nonfree_baggages",
        "insurance",
    ]
    assert db["reservations"]["HATHAT"] == out
    user = db["users"]["u1"]
    assert user["payment_methods"]["gift_card_1"]["amount"] == 10
    assert "certificate_1" not in user["payment_methods"]  # a used certificate is gone
    assert user["reservations"] == ["R1", "HATHAT"]
    assert db["flights"]["F2"] == base["flights"]["F2"]  # seats are never updated
    CancelReservation.invoke(db, reservation_id="HATHAT")
    assert kwargs == caller  # later writes never reach the caller's lists
    assert base.to_dict() == small_tables()


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"user_id": "nobody"}, "Error: user not found"),
        ({"flights": [{"flight_number": "F9", "date": DAY}]}, "Error: flight F9 not found"),
        (
            {"flights": [{"flight_number": "F2", "date": "2024-06-01"}]},
            "Error: flight F2 not found on date 2024-06-01",
        ),
        (
            {"flights": [{"flight_number": "F1", "date": "2024-05-21"}]},
            "Error: flight F1 not available on date 2024-05-21",
        ),
        (
            {"flights": [{"flight_number": "F1", "date": DAY}], "passengers": [ALICE, BOB, ALICE]},
            "Error: not enough seats on flight F1",
        ),
        (
            {"payment_methods": [{"payment_id": "gift_card_9", "amount": 200}]},
            "Error: payment method gift_card_9 not found",
        ),
        (
            {"payment_methods": [{"payment_id": "gift_card_1", "amount": 200}]},
            "Error: not enough balance in payment method gift_card_1",
        ),
        (
            {"payment_methods": [{"payment_id": "credit_card_1", "amount": 199}]},
            "Error: payment amount does not add up, total price is 200, but paid 199",
        ),
    ],
)
def test_book_errors_change_nothing(db: Database, changes: dict[str, Any], error: str) -> None:
    assert BookReservation.invoke(db, **_booking(**changes)) == error
    assert db.to_dict() == small_tables()


def test_book_picks_hathat_hathau_hathav_then_overwrites(db: Database) -> None:
    free = _booking(flights=[], payment_methods=[])
    ids = [json.loads(BookReservation.invoke(db, **free))["reservation_id"] for _ in range(4)]
    assert ids == ["HATHAT", "HATHAU", "HATHAV", "HATHAV"]
    assert db["users"]["u1"]["reservations"] == ["R1", "HATHAT", "HATHAU", "HATHAV", "HATHAV"]


def test_book_one_gift_card_twice_can_overdraw(db: Database) -> None:
    # each payment (75) is checked against the balance (100) alone, as in the source
    payments = [{"payment_id": "gift_card_1", "amount": 75}] * 2
    BookReservation.invoke(db, **_booking(flights=[], nonfree_baggages=3, payment_methods=payments))
    assert _gift_card(db) == -50


def test_book_one_certificate_twice_raises_after_charging(db: Database) -> None:
    payments = [
        {"payment_id": "gift_card_1", "amount": 50},
        {"payment_id": "certificate_1", "amount": 25},
        {"payment_id": "certificate_1", "amount": 25},
    ]
    with pytest.raises(KeyError, match="certificate_1"):
        BookReservation.invoke(
            db, **_booking(flights=[], nonfree_baggages=2, payment_methods=payments)
        )
    assert _gift_card(db) == 50  # charged before the failure, as in the source
    assert "certificate_1" not in db["users"]["u1"]["payment_methods"]
    assert "HATHAT" not in db["reservations"]


# -- other writes -------------------------------------------------------------------------------


def test_cancel_refunds_every_payment_so_far(db: Database) -> None:
    once = json.loads(CancelReservation.invoke(db, reservation_id="R1"))
    assert once["status"] == "cancelled"
    assert once["payment_history"] == [
        {"payment_id": "gift_card_1", "amount": 200},
        {"payment_id": "gift_card_1", "amount": -200},
    ]
    twice = json.loads(CancelReservation.invoke(db, reservation_id="R1"))
    assert [p["amount"] for p in twice["payment_history"]] == [200, -200, -200, 200]
    assert _gift_card(db) == 100  # no balance moves: refunds are records only
    assert CancelReservation.invoke(db, reservation_id="R9") == "Error: reservation not found"


def test_update_flights_charges_and_refunds_the_difference(db: Database) -> None:
    same = [{"flight_number": "F1", "date": DAY}]
    kept = json.loads(UpdateReservationFlights.invoke(db, "R1", "economy", same, "gift_card_1"))
    assert kept["payment_history"] == [{"payment_id": "gift_card_1", "amount": 200}]
    assert kept["flights"] == [
        {"flight_number": "F1", "date": DAY, "price": 100, "origin": "AAA", "destination": "BBB"}
    ]
    # a cabin change reprices even an unchanged flight: 2 x (50 - 100) = -100, refunded
    cheaper = json.loads(
        UpdateReservationFlights.invoke(db, "R1", "basic_economy", same, "gift_card_1")
    )
    assert cheaper["payment_history"][-1] == {"payment_id": "gift_card_1", "amount": -100}
    assert _gift_card(db) == 200
    # the cabin is not stored: business on F2 costs 2 x (300 - 50) = 500 > 200 on the gift card
    other = [{"flight_number": "F2", "date": DAY}]
    assert (
        UpdateReservationFlights.invoke(db, "R1", "business", other, "gift_card_1")
        == "Error: gift card balance is not enough"
    )
    assert (
        UpdateReservationFlights.invoke(db, "R1", "business", other, "certificate_1")
        == "Error: certificate cannot be used to update reservation"
    )
    assert (
        UpdateReservationFlights.invoke(db, "R1", "business", other, "nope")
        == "Error: payment method not found"
    )
    paid = json.loads(UpdateReservationFlights.invoke(db, "R1", "business", other, "credit_card_1"))
    assert paid["cabin"] == "economy" and paid["payment_history"][-1]["amount"] == 500
    assert db["flights"].touched_keys() == set()


def test_update_baggages_charges_only_new_nonfree_bags(db: Database) -> None:
    out = json.loads(UpdateReservationBaggages.invoke(db, "R1", 4, 2, "gift_card_1"))
    assert (out["total_baggages"], out["nonfree_baggages"]) == (4, 2)
    assert out["payment_history"][-1] == {"payment_id": "gift_card_1", "amount": 100}
    assert _gift_card(db) == 0
    fewer = json.loads(UpdateReservationBaggages.invoke(db, "R1", 1, 1, "gift_card_1"))
    assert len(fewer["payment_history"]) == 2 and fewer["nonfree_baggages"] == 1
    assert (
        UpdateReservationBaggages.invoke(db, "R1", 3, 3, "gift_card_1")
        == "Error: gift card balance is not enough"
    )


def test_update_passengers_keeps_the_count_and_copies(db: Database) -> None:
    assert (
        UpdateReservationPassengers.invoke(db, "R1", [ALICE])
        == "Error: number of passengers does not match"
    )
    new = [dict(ALICE, dob="1981-01-01"), BOB]
    UpdateReservationPassengers.invoke(db, "R1", new)
    new[0]["dob"] = "changed by the caller"
    assert db["reservations"]["R1"]["passengers"][0]["dob"] == "1981-01-01"


def test_send_certificate_uses_three_ids_then_returns_none(db: Database) -> None:
    texts = [SendCertificate.invoke(db, user_id="u1", amount=150) for _ in range(4)]
    assert texts[:3] == [
        f"Certificate certificate_{n} added to user u1 with amount 150."
        for n in (3221322, 3221323, 3221324)
    ]
    assert texts[3] is None
    assert db["users"]["u1"]["payment_methods"]["certificate_3221324"] == {
        "source": "certificate",
        "amount": 150,
        "id": "certificate_3221324",
    }
    assert SendCertificate.invoke(db, user_id="nobody", amount=1) == "Error: user not found"


# -- reads --------------------------------------------------------------------------------------


def test_unknown_reservation_says_user_not_found(db: Database) -> None:
    assert GetReservationDetails.invoke(db, reservation_id="R9") == "Error: user not found"


def test_onestop_next_day_quirks(db: Database) -> None:
    # F1 lands after midnight: the second leg is dated day+1 without zero padding...
    early = json.loads(SearchOnestopFlight.invoke(db, "AAA", "CCC", "2024-05-01"))
    assert [[leg["date"] for leg in pair] for pair in early] == [["2024-05-01", "2024-05-2"]]
    assert early[0][1]["prices"]["economy"] == 5
    # ...and its status, seats and prices come from the first leg's date (DAY, not DAY + 1)
    (pair,) = json.loads(SearchOnestopFlight.invoke(db, "AAA", "CCC", DAY))
    assert pair[1]["date"] == "2024-05-21" and pair[1]["prices"]["economy"] == 200
    assert "dates" not in pair[0] and pair[0]["prices"]["economy"] == 100
    # so a second leg flown on day+1 but not on the first leg's date raises KeyError
    tables = small_tables()
    del tables["flights"]["F2"]["dates"]["2024-05-01"]
    with pytest.raises(KeyError, match="2024-05-01"):
        SearchOnestopFlight.invoke(Database(tables), "AAA", "CCC", "2024-05-01")


# -- the benchmark database ---------------------------------------------------------------------


def test_gold_actions_of_all_tasks_succeed(benchmarks_dir: Path) -> None:
    """No airline gold action fails in the source; none may fail here, and the base stays put."""
    base = Database.load(benchmarks_dir / "airline" / "db")
    tasks = json.loads((benchmarks_dir / "airline" / "tasks_test.json").read_text())
    touched: dict[str, set[str]] = {"flights": set(), "reservations": set(), "users": set()}
    for task in tasks:
        db = base.fork()
        for action in task["actions"]:
            out = SPEC.tool_map[action["name"]].invoke(db, **action["kwargs"])
            assert not out.startswith("Error"), (task["user_id"], action, out)
        for name, keys in touched.items():
            keys |= db[name].touched_keys()
    assert touched["flights"] == set() and touched["users"] and touched["reservations"]
    fresh = Database.load(benchmarks_dir / "airline" / "db")
    for name, keys in touched.items():
        for key in keys & set(fresh[name]):
            assert base[name][key] == fresh[name][key], (name, key)


# Without a ``respond`` that carries the task's outputs the source gives these tasks reward 0:
# the gold actions contain no messages, so the output check fails.
TASKS_WITH_OUTPUTS = (2, 8, 9, 44)


def test_gold_replay_through_tool_env_earns_reward_one(benchmarks_dir: Path) -> None:
    data = load_domain_data("airline", benchmarks_dir / "airline")
    tasks = data.tasks("test")
    assert len(tasks) == 50
    assert tuple(i for i, task in enumerate(tasks) if task.outputs) == TASKS_WITH_OUTPUTS
    rewards = []
    for index, task in enumerate(tasks):
        env = ToolEnv(data, "test", index)
        answer = Action(RESPOND, {"content": "Totals: " + ", ".join(task.outputs)})
        result = None
        for action in (answer, *task.actions):
            result = env.step(action)
        assert result is not None
        # every terminate tool is a task's last gold action; other episodes end with the user
        last = task.actions[-1].name if task.actions else None  # some tasks expect no action
        assert result.done == (last in SPEC.terminate_tools)
        rewards.append(result.reward if result.done else env.reward()[0])
    assert rewards == [1.0] * len(tasks)


def test_gold_replay_without_the_outputs_fails_only_the_output_check(benchmarks_dir: Path) -> None:
    data = load_domain_data("airline", benchmarks_dir / "airline")
    for index in TASKS_WITH_OUTPUTS:
        env = ToolEnv(data, "test", index)
        for action in data.task("test", index).actions:
            env.step(action)
        reward, info = env.reward()
        assert (reward, info["r_actions"], info["r_outputs"]) == (0.0, 1.0, 0.0)
    skipped_booking = ToolEnv(data, "test", 0)  # task 0's only gold action is a booking
    assert skipped_booking.reward() == (0.0, {"r_actions": 0.0})
