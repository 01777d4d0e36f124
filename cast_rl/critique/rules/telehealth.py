"""Telehealth policy (tau-trait ``wiki.md``) as visible rules.

* authenticate by ``find_patient_by_email`` or ``find_patient_by_name_dob`` before any patient
  data is read or changed; one patient per conversation, except the patient's kids or aged
  parents when the patient asks for them;
* scheduling, rescheduling, cancelling and changing records need the details listed and an
  explicit yes;
* cancel or reschedule only an appointment shown as scheduled or pending approval (its status
  must have been seen);
* schedule only after the provider's availability was checked, at a time the provider's weekly
  schedule offers; reschedule likewise to an offered time.  Where the agent asked for the
  schedule and the tool failed to show it (some providers' records break it), the check counts
  as made: nothing more is visible, and the booking tools reject a time the provider does not
  offer.  The tools also reject a change to a completed or cancelled appointment (the only
  inactive statuses in the data), so an unchecked status or schedule is marked
  :attr:`~cast_rl.critique.rules.base.Finding.tool_checks` (the labeller drops it when the call
  goes through).
"""

from __future__ import annotations

import re
from datetime import date as Date
from typing import Any

from cast_rl.critique.context import Visible
from cast_rl.critique.rationale import Evidence
from cast_rl.critique.rules.base import Ctx, DomainRules, Finding
from cast_rl.critique.rules.state import latest_text, line_evidence, text_field, user_said

_ACTIVE = ("scheduled", "pending approval", "pending_approval")
_FAMILY = r"\b(kids?|child(ren)?|son|daughter|mother|father|mom|dad|parents?|family)\b"
_APPT_TOOLS = ("get_appointment_details", "list_patient_appointments", "cancel_appointment",
               "reschedule_appointment", "schedule_appointment")


class TelehealthRules(DomainRules):
    name = "telehealth"
    subject_arg = "patient_id"
    auth_tools = ("find_patient_by_email", "find_patient_by_name_dob")
    public_tools = frozenset({
        "think", "calculate", "list_available_providers", "get_provider_details",
        "list_medication_suppliers", "check_drug_interactions", "list_telemetry_devices",
        "list_telemetry_uploads", "get_telemetry_upload",
    })
    write_tools = frozenset({
        "schedule_appointment", "cancel_appointment", "reschedule_appointment",
        "update_prescription_supplier", "update_medical_record_note",
    })
    terminate_tools = frozenset({"transfer_to_human_support"})
    confirm_keys = {
        "schedule_appointment": ("date", "time"),
        "cancel_appointment": ("appointment_id",),
        "reschedule_appointment": ("appointment_id",),
        "update_prescription_supplier": ("record_id", "supplier_company"),
        "update_medical_record_note": ("record_id",),
    }
    free_text = {
        "think": frozenset({"thought", "note"}),
        "calculate": frozenset({"expression"}),
        "transfer_to_human_support": frozenset({"reason"}),
        "schedule_appointment": frozenset({"payment_notes"}),
        "update_medical_record_note": frozenset({"note", "metadata"}),
    }
    auth_clause = (("authenticate the patient",), ("authenticated before",))
    one_user_clause = (("one patient per conversation",),)
    confirm_clause = (("explicit patient confirmation",), ("confirmation",))

    def family(self, ctx: Ctx, other: str) -> bool:
        """A kid or aged parent the patient named: their id or first name, and a family word."""
        if user_said(ctx.visible, _FAMILY) is None:
            return False
        first = other.split("_")[0]
        return user_said(ctx.visible, rf"\b({re.escape(other)}|{re.escape(first)})\b") is not None

    def record_owner(self, ctx: Ctx, arg: str, value: Any) -> tuple[str, Evidence] | None:
        if arg == "appointment_id" and isinstance(value, str):
            record = latest_text(ctx.visible, ("get_appointment_details",), f"(ID: {value})")
            if record is not None:
                match = re.search(r"^Patient: .*\(ID: (\S+)\)$", record.output or "", re.M)
                if match:
                    return match.group(1), line_evidence(record, "Patient:")[0]
        if arg == "record_id" and isinstance(value, str):
            record = latest_text(ctx.visible, ("get_medical_record",), f"(ID: {value})")
            if record is not None:
                match = re.search(r"^Patient: .*\(ID: (\S+)\)$", record.output or "", re.M)
                if match:
                    return match.group(1), line_evidence(record, "Patient:")[0]
        return None

    def check(self, ctx: Ctx) -> list[Finding]:
        name, kwargs = ctx.action.name, ctx.action.kwargs
        if name in ("cancel_appointment", "reschedule_appointment"):
            found = _status_of(ctx.visible, str(kwargs.get("appointment_id")))
            if found is None:
                return [Finding(
                    "policy_violation",
                    f"The status of appointment {kwargs.get('appointment_id')!r} was not checked "
                    f"before {name}; only scheduled or pending-approval appointments qualify.",
                    clause=(("status is 'scheduled' or 'pending_approval'",), ("scheduled",)),
                    suggested_fix="Look the appointment up first and check its status.",
                    source="status_unchecked",
                    tool_checks=True,
                )]
            status, evidence = found
            if status not in _ACTIVE:
                return [Finding(
                    "policy_violation",
                    f"The appointment is shown as {status!r}; only scheduled or pending-approval "
                    "appointments can be cancelled or rescheduled.",
                    evidence=evidence,
                    clause=(("status is 'scheduled' or 'pending_approval'",),),
                    suggested_fix="Tell the patient this appointment cannot be changed.",
                    source="status",
                )]
        if name == "schedule_appointment":
            return _slot(ctx, str(kwargs.get("provider_id")), kwargs.get("date"), kwargs.get("time"))
        if name == "reschedule_appointment":
            details = latest_text(ctx.visible, ("get_appointment_details",),
                                  f"(ID: {kwargs.get('appointment_id')})")
            match = re.search(r"^Provider: .*\(ID: (\S+)\)$", (details.output or "") if details else "", re.M)
            if match:
                return _slot(ctx, match.group(1), kwargs.get("new_date"), kwargs.get("new_time"))
        return []


def _status_of(visible: Visible, appointment_id: str) -> tuple[str, list[Evidence]] | None:
    """The latest visible status of an appointment, with the line that shows it."""
    for record in reversed(visible.calls(*_APPT_TOOLS, ok=True)):
        output = record.output or ""
        if appointment_id not in output:
            continue
        if record.name == "cancel_appointment" and record.kwargs.get("appointment_id") == appointment_id:
            return "cancelled", line_evidence(record, "cancelled")
        if record.name in ("reschedule_appointment", "schedule_appointment"):
            return "scheduled", line_evidence(record, appointment_id)
        if record.name == "get_appointment_details" and f"(ID: {appointment_id})" in output:
            status = text_field(output, "Status")
            if status:
                return status.lower(), line_evidence(record, "Status:")
        for line in output.splitlines():
            if line.strip().startswith(f"- {appointment_id}:"):
                match = re.search(r"\[([^,\]]+)", line)
                if match:
                    return match.group(1).strip().lower(), [Evidence(record.output_index, line.strip())]
    return None


def _schedule_unavailable(visible: Visible, provider_id: str) -> bool:
    """Whether the agent asked for the provider's schedule and the tool could not show it (an
    error): the check was made as far as the tools allow, and the booking tool checks the slot
    itself."""
    return any(
        r.kwargs.get("provider_id") == provider_id and r.output is not None and not r.ok
        for r in visible.calls("get_provider_details")
    )


def _slot(ctx: Ctx, provider_id: str, day: Any, time: Any) -> list[Finding]:
    record = latest_text(ctx.visible, ("get_provider_details",), f"(ID: {provider_id})")
    if record is None and _schedule_unavailable(ctx.visible, provider_id):
        return []
    if record is None:
        return [Finding(
            "policy_violation",
            f"The availability of provider {provider_id!r} was not checked before booking.",
            clause=(("check provider availability",),),
            suggested_fix="Call get_provider_details and pick a time from the provider's schedule.",
            source="availability_unchecked",
            tool_checks=True,
        )]
    try:
        weekday = Date.fromisoformat(str(day)).strftime("%A")
    except ValueError:
        return []
    offered = text_field(record.output or "", weekday)
    times = [t.strip() for t in (offered or "").split(",") if t.strip()]
    if str(time) in times:
        return []
    evidence = line_evidence(record, f"{weekday}:") or line_evidence(record, "Weekly Schedule")
    return [Finding(
        "policy_violation",
        f"The provider's schedule shown does not offer {time} on {weekday}s.",
        evidence=evidence,
        clause=(("must be available in the provider's schedule",), ("specific days and times",)),
        suggested_fix="Offer the patient one of the times the provider's schedule lists.",
        source="slot",
    )]
