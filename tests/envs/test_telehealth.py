"""Telehealth domain: tool behaviour worked out by hand from the data, the source's quirks, and
gold replay through :class:`ToolEnv`.

The observation-for-observation comparison with tau-trait's own code is in
``test_fuzz_tau_trait.py``; this file needs only the benchmark data.

Run: .venv/bin/python -m pytest tests/envs/test_telehealth.py -q
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cast_rl.envs.core import DomainData, ToolEnv, call_tool, fixed_clock, load_domain_data
from cast_rl.envs.db import Database
from cast_rl.envs.domain import get_domain, tool_name
from cast_rl.envs.domains.telehealth import SPEC
from cast_rl.envs.types import RESPOND, Action

SPLITS = ("train", "dev", "test")
TODAY = "2031-01-02T08:00:00"


@pytest.fixture(scope="module")
def data(benchmarks_dir: Path) -> DomainData:
    return load_domain_data("telehealth", benchmarks_dir / "telehealth", clock=fixed_clock(TODAY))


@pytest.fixture
def db(data: DomainData) -> Database:
    return data.db.fork()


def run(data: DomainData, db: Database, name: str, **kwargs: Any) -> str:
    return call_tool(data, db, Action(name, kwargs))


def test_spec_matches_tool_schemas(data: DomainData) -> None:
    assert get_domain("telehealth") is SPEC
    assert [tool_name(tool) for tool in SPEC.tools] == [t["function"]["name"] for t in data.tools]
    assert SPEC.terminate_tools == ("transfer_to_human_support",)
    assert SPEC.write_tools <= set(SPEC.tool_map)
    for schema in data.tools:
        function = schema["function"]
        params = SPEC.tool_map[function["name"]].invoke.__code__.co_varnames
        assert set(function["parameters"].get("required", [])) <= set(params), function["name"]


def test_schedule_appointment_numbers_after_the_highest_id(data: DomainData, db: Database) -> None:
    # 2025-06-09 is a Monday; Dr. Garcia (Primary Care) works Mondays at 08:00.
    out = run(
        data,
        db,
        "schedule_appointment",
        patient_id="sarah_johnson_1234",
        provider_id="dr_garcia_primary",
        date="2025-06-09",
        time="08:00",
        appointment_type="follow_up",
    )
    assert out == "\n".join(
        [
            "Appointment successfully scheduled!",
            "",
            "Appointment ID: APPT059",
            "Patient: Sarah Johnson",
            "Provider: Dr. Garcia - Primary Care",
            "Date: 2025-06-09",
            "Time: 08:00",
            "Type: Follow Up",
            "Copay: $25.00",
            "Insurance Authorization: AUTH000059",
            "Meeting Link: https://telehealth.healthcenter.com/room/APPT059",
            "",
            "Please save your appointment ID for future reference.",
        ]
    )
    assert db["appointments"]["APPT059"] == {
        "appointment_id": "APPT059",
        "patient_id": "sarah_johnson_1234",
        "provider_id": "dr_garcia_primary",
        "date": "2025-06-09",
        "time": "08:00",
        "duration_minutes": 30,
        "type": "follow_up",
        "status": "scheduled",
        "notes": "",
        "insurance_authorization": "AUTH000059",
        "copay_amount": 25.0,
        "meeting_link": "https://telehealth.healthcenter.com/room/APPT059",
        "payment_method": "insurance",
        "voucher_id": None,
        "insurance_billed": True,
    }
    # The same slot is now taken; a self-pay booking elsewhere gets the next id.
    assert run(
        data,
        db,
        "schedule_appointment",
        patient_id="sarah_johnson_1234",
        provider_id="dr_garcia_primary",
        date="2025-06-09",
        time="08:00",
        appointment_type="follow_up",
    ) == ("Provider dr_garcia_primary already has an appointment scheduled at 08:00 on 2025-06-09.")
    voucher = run(
        data,
        db,
        "schedule_appointment",
        patient_id="sarah_johnson_1234",
        provider_id="dr_garcia_primary",
        date="2025-06-09",
        time="09:00",
        appointment_type="consultation",
        bill_insurance=False,
        voucher_id="THV-224",
    )
    assert "Appointment ID: APPT060" in voucher
    assert (
        "Payment Method: Telehealth Voucher\nVoucher Applied: THV-224\nAmount Due Today: $0.00"
        in voucher
    )
    assert db["appointments"]["APPT060"]["copay_amount"] == 0.0
    # A scheduled appointment has no chief complaint, which get_appointment_details reads.
    assert run(data, db, "get_appointment_details", appointment_id="APPT059") == (
        "Error: 'chief_complaint'"
    )
    assert "APPT059" not in data.db["appointments"]


def test_schedule_appointment_validates_the_slot(data: DomainData, db: Database) -> None:
    base = {"patient_id": "sarah_johnson_1234", "provider_id": "dr_garcia_primary"}
    assert (
        run(
            data,
            db,
            "schedule_appointment",
            **base,
            date="2025-06-07",
            time="08:00",
            appointment_type="x",
        )
        == "Provider dr_garcia_primary does not work on Saturday."
    )
    assert run(
        data,
        db,
        "schedule_appointment",
        **base,
        date="2025-06-11",
        time="16:00",
        appointment_type="x",
    ) == (
        "Provider dr_garcia_primary is not available at 16:00 on Wednesday. Available times: "
        "06:00, 08:00, 09:00, 10:00, 11:00, 14:00, 15:00"
    )
    assert (
        run(
            data,
            db,
            "schedule_appointment",
            **base,
            date="06/09/2025",
            time="08:00",
            appointment_type="x",
        )
        == "Invalid date format: 06/09/2025. Please use YYYY-MM-DD format."
    )
    # A non-string type fails only after the appointment was stored, as in the source.
    assert (
        run(
            data,
            db,
            "schedule_appointment",
            **base,
            date="2025-06-09",
            time="10:00",
            appointment_type=7,
        )
        == "Error: 'int' object has no attribute 'replace'"
    )
    assert db["appointments"]["APPT059"]["type"] == 7


def test_cancel_appointment_stamps_the_injected_clock(data: DomainData, db: Database) -> None:
    out = run(data, db, "cancel_appointment", appointment_id="APPT001")
    assert out.splitlines()[:8] == [
        "Appointment successfully cancelled.",
        "",
        "Appointment ID: APPT001",
        "Patient: Sarah Johnson",
        "Provider: Dr. Garcia",
        "Original Date/Time: 2024-01-15 at 09:00",
        "Cancellation Reason: Patient Cancelled",
        "Cancellation Date: 2031-01-02",
    ]
    record = db["appointments"]["APPT001"]
    assert (record["status"], record["cancellation_date"]) == ("cancelled", "2031-01-02")
    assert run(data, db, "cancel_appointment", appointment_id="APPT001") == (
        "Appointment APPT001 is already cancelled."
    )
    assert run(data, db, "cancel_appointment", appointment_id="APPT002") == (
        "Cannot cancel appointment APPT002 - appointment has already been completed."
    )
    assert data.db["appointments"]["APPT001"]["status"] == "scheduled"


def test_reschedule_appointment(data: DomainData, db: Database) -> None:
    out = run(
        data,
        db,
        "reschedule_appointment",
        appointment_id="APPT001",
        new_date="2025-06-10",
        new_time="14:00",
    )
    assert "Previous Date/Time: 2024-01-15 at 09:00\nNew Date/Time: 2025-06-10 at 14:00" in out
    assert (db["appointments"]["APPT001"]["date"], db["appointments"]["APPT001"]["time"]) == (
        "2025-06-10",
        "14:00",
    )
    assert run(
        data,
        db,
        "reschedule_appointment",
        appointment_id="APPT005",
        new_date="2025-06-10",
        new_time="14:00",
    ) == ("Cannot reschedule appointment APPT005 - appointment has been cancelled.")


def test_update_prescription_supplier_keeps_the_pharmacy_on_a_bad_price(
    data: DomainData, db: Database
) -> None:
    out = run(
        data,
        db,
        "update_prescription_supplier",
        record_id="REC001",
        medication="sertraline 50mg",
        supplier_company="Acme",
        brand_name="Zoloft",
        price_usd="12.5",
    )
    prescription = json.loads(out)["prescriptions"][0]
    assert prescription["pharmacy"] == "Acme (Zoloft)"
    assert prescription["supplier"] == {
        "company": "Acme",
        "brand_name": "Zoloft",
        "price_usd": 12.5,
        "currency": "USD",
    }
    bad = run(
        data,
        db,
        "update_prescription_supplier",
        record_id="REC005",
        medication="Atorvastatin",
        supplier_company="Beta",
        brand_name="Lipitor",
        price_usd="cheap",
    )
    assert bad == "Error: could not convert string to float: 'cheap'"
    changed = db["medical_records"]["REC005"]["prescriptions"][0]
    assert changed["pharmacy"] == "Beta (Lipitor)" and "supplier" not in changed
    assert (
        run(
            data,
            db,
            "update_prescription_supplier",
            record_id="REC002",
            medication="x",
            supplier_company="a",
            brand_name="b",
            price_usd=1,
        )
        == "Error: medical record has no prescriptions"
    )
    original = data.db["medical_records"]["REC005"]["prescriptions"][0]
    assert original["pharmacy"] == "Grand Rapids Wellness Pharmacy"


def test_record_notes_own_a_copy_of_the_metadata(data: DomainData, db: Database) -> None:
    metadata = {"upload": {"device_id": "VC-449", "date": "2025-06-04"}}
    out = run(
        data, db, "update_medical_record_note", record_id="REC001", note="seen", metadata=metadata
    )
    assert json.loads(out)["notes"] == [{"note": "seen", "metadata": metadata}]
    metadata["upload"]["date"] = "changed later"
    assert db["medical_records"]["REC001"]["notes"][0]["metadata"]["upload"]["date"] == "2025-06-04"
    run(data, db, "update_medical_record_note", record_id="REC001", note="again", metadata={})
    assert db["medical_records"]["REC001"]["notes"][1] == {"note": "again"}
    assert "notes" not in data.db["medical_records"]["REC001"]


def test_source_quirks_seen_in_gold_actions(data: DomainData, db: Database) -> None:
    assert run(data, db, "think", note="plan") == (
        "Error: Think.invoke() got an unexpected keyword argument 'note'"
    )
    assert run(data, db, "list_available_providers", min_years_experience=5) == (
        "Error: ListAvailableProviders.invoke() got an unexpected keyword argument "
        "'min_years_experience'"
    )
    assert (
        run(data, db, "get_appointment_details", appointment_id="APPT005")
        == "Error: 'meeting_link'"
    )
    assert run(data, db, "get_appointment_details", appointment_id="APPT032") == (
        "Appointment with ID APPT032 not found."
    )
    assert run(
        data,
        db,
        "find_patient_by_name_dob",
        first_name="SARAH",
        last_name="johnson",
        date_of_birth="x",
    ) == ("No patient found with name: SARAH johnson and DOB: x")


def test_transfer_ends_the_episode(data: DomainData) -> None:
    env = ToolEnv(data, "test", 0)
    result = env.step(Action("transfer_to_human_support", {"reason": "needs a nurse"}))
    assert result.done
    assert result.observation.startswith(
        "Transferring you to a human support representative.\n\nReason for transfer: needs a nurse\n"
    )
    assert result.observation.endswith(
        "Estimated wait time: 2-3 minutes.\n\nThank you for your patience."
    )


def _gold_episode_reward(data: DomainData, split: str, index: int) -> float:
    """Play the gold actions as the agent, say every required output, end as the user would.

    A terminate tool ends the episode where it stands (test task 13 transfers at action 18 of
    21; the two reads after it never run, and the reward is still 1.0 since they write nothing).
    """
    env = ToolEnv(data, split, index, max_steps=None)
    if env.task.outputs:
        env.step(Action(RESPOND, {"content": " ".join(env.task.outputs)}))
    for action in env.task.actions:
        result = env.step(action)
        if result.done:
            return result.reward
    return env.reward()[0]


@pytest.mark.parametrize("split", SPLITS)
def test_gold_replay_gets_full_reward(data: DomainData, split: str) -> None:
    rewards = [_gold_episode_reward(data, split, i) for i in range(len(data.tasks(split)))]
    assert rewards == [1.0] * len(rewards)


def test_mid_sequence_transfer_ends_test_task_13(data: DomainData) -> None:
    env = ToolEnv(data, "test", 13, max_steps=None)
    names = [action.name for action in env.task.actions]
    assert names.index("transfer_to_human_support") == 18 and len(names) == 21
    for action in env.task.actions[:19]:
        result = env.step(action)
    assert result.done and result.reward == 1.0
    with pytest.raises(RuntimeError):
        env.step(env.task.actions[19])
