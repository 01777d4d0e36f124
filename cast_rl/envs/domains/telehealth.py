"""tau-trait's telehealth domain: patients, providers, appointments, records and medications.

Reimplements the 23 tools of ``tau_trait/envs/telehealth/env.py`` (its ``ALL_TOOLS``) with the
source's keyword arguments, observation strings, state changes and exceptions, including:

* ``schedule_appointment`` ids are ``APPT<highest existing number + 1>``; the new appointment
  has no ``chief_complaint``, so ``get_appointment_details`` on it fails with ``KeyError``;
* ``cancel_appointment`` stamps "today"; the source calls ``datetime.now()``, we read
  ``data.clock()`` so replays are reproducible (same ``%Y-%m-%d`` format);
* ``update_medical_record_note`` stores ``metadata`` in the record (by reference in the source;
  here a deep copy with the same value, since only the resulting state is observable);
* several tools change state and then fail on a later step (``schedule_appointment`` with a
  non-string ``appointment_type``, ``reschedule_appointment`` on an appointment without a
  meeting link, ``update_prescription_supplier`` with a non-numeric price); the partial change
  stays, as in the source.

Tools follow the copy-on-write contract of :mod:`cast_rl.envs.db`.
"""

from __future__ import annotations

import copy
import datetime
import json
from typing import Any

from cast_rl.envs.db import Database
from cast_rl.envs.domain import DomainSpec, register
from cast_rl.envs.domains.common import Calculate, Think

ACTIVE_STATUSES = ["scheduled", "pending_approval"]
SEVERITY_RANK = {"low": 1, "moderate": 2, "high": 3}


def _detached(value: Any) -> Any:
    """A copy of a caller-supplied value that the database may own."""
    return copy.deepcopy(value)


def _titled(text: str) -> str:
    """``follow_up`` -> ``Follow Up``."""
    return text.replace("_", " ").title()


def _wants_limit(limit: Any) -> bool:
    return limit is not None and limit > 0


def _patient_name_or_default(patient: dict[str, Any]) -> str:
    name = patient.get("name", {})
    return f"{name.get('first_name', 'Unknown')} {name.get('last_name', 'Patient')}"


def _doctor_label(provider: dict[str, Any]) -> str:
    return f"Dr. {provider.get('name', {}).get('last_name', 'Unknown Provider')}"


def _full_provider_name(provider: dict[str, Any]) -> str:
    name = provider["name"]
    return f"{name.get('title', 'Dr.')} {name['first_name']} {name['last_name']}"


def _appointment_missing(appointment_id: Any) -> str:
    return f"Appointment with ID {appointment_id} not found."


def _slot_problem(provider_id: Any, provider: dict[str, Any], date: Any, time: Any) -> str | None:
    """Why the provider cannot take ``date`` at ``time`` per the weekly schedule, or None."""
    try:
        weekday = datetime.datetime.strptime(date, "%Y-%m-%d").strftime("%A").lower()
        if weekday not in provider["schedule"]:
            return f"Provider {provider_id} does not work on {weekday.title()}."
        offered = provider["schedule"][weekday]
        if time not in offered:
            listed = ", ".join(offered) if offered else "None"
            return (
                f"Provider {provider_id} is not available at {time} on {weekday.title()}. "
                f"Available times: {listed}"
            )
    except ValueError:
        return f"Invalid date format: {date}. Please use YYYY-MM-DD format."
    return None


def _booked(appointment: dict[str, Any], provider_id: Any, date: Any, time: Any) -> bool:
    return (
        appointment["provider_id"] == provider_id
        and appointment["date"] == date
        and appointment["time"] == time
        and appointment["status"] in ACTIVE_STATUSES
    )


def _double_booking(provider_id: Any, date: Any, time: Any) -> str:
    return f"Provider {provider_id} already has an appointment scheduled at {time} on {date}."


class FindPatientByEmail:
    """Patient id with exactly this e-mail (case-sensitive)."""

    @staticmethod
    def invoke(data: Database, email: str) -> str:
        for patient_id, patient in data["patients"].items():
            if patient["demographics"]["email"] == email:
                return patient_id
        return f"No patient found with email: {email}"


class FindPatientByNameDOB:
    """Patient id by case-insensitive first and last name and exact date of birth."""

    name = "find_patient_by_name_dob"

    @staticmethod
    def invoke(data: Database, first_name: str, last_name: str, date_of_birth: str) -> str:
        for patient_id, patient in data["patients"].items():
            # Short-circuit order matters: a non-string last_name only fails once a first name
            # matches, exactly as in the source.
            if (
                patient["name"]["first_name"].lower() == first_name.lower()
                and patient["name"]["last_name"].lower() == last_name.lower()
                and patient["demographics"]["date_of_birth"] == date_of_birth
            ):
                return patient_id
        return f"No patient found with name: {first_name} {last_name} and DOB: {date_of_birth}"


def _joined_or_none(items: list[Any]) -> str:
    return ", ".join(items) if items else "None"


class GetPatientDetails:
    @staticmethod
    def invoke(data: Database, patient_id: str) -> str:
        patients = data["patients"]
        if patient_id not in patients:
            return f"Patient with ID {patient_id} not found."
        patient = patients[patient_id]
        name = f"{patient['name']['first_name']} {patient['name']['last_name']}"
        demo = patient["demographics"]
        address = patient["address"]
        insurance = patient["insurance"]["primary"]
        history = patient["medical_history"]
        contact = patient["emergency_contact"]
        sections = [
            f"Patient Details for {name} (ID: {patient_id})",
            "",
            "Demographics:",
            f"- Date of Birth: {demo['date_of_birth']}",
            f"- Gender: {demo['gender']}",
            f"- Phone: {demo['phone']}",
            f"- Email: {demo['email']}",
            "",
            "Address:",
            f"- {address['address1']}",
            f"- {address['address2']}",
            f"- {address['city']}, {address['state']} {address['zip']}",
            f"- {address['country']}",
            "",
            "Insurance:",
            f"- Provider: {insurance['provider']}",
            f"- Policy Number: {insurance['policy_number']}",
            f"- Primary Care Copay: ${insurance['copay_primary']:.2f}",
            f"- Specialist Copay: ${insurance['copay_specialist']:.2f}",
            "",
            "Medical History:",
            f"- Conditions: {_joined_or_none(history['conditions'])}",
            f"- Allergies: {_joined_or_none(history['allergies'])}",
            "- Current Medications: "
            + _joined_or_none(
                [f"{m['name']} {m['dosage']} {m['frequency']}" for m in history["medications"]]
                if history["medications"]
                else []
            ),
            "",
            "Emergency Contact:",
            f"- {contact['name']} ({contact['relationship']})",
            f"- Phone: {contact['phone']}",
        ]
        return "\n".join(sections)


class GetAppointmentDetails:
    @staticmethod
    def invoke(data: Database, appointment_id: str) -> str:
        appointments = data["appointments"]
        if appointment_id not in appointments:
            return _appointment_missing(appointment_id)
        appt = appointments[appointment_id]
        patient = data["patients"].get(appt["patient_id"], {})
        provider = data["providers"].get(appt["provider_id"], {})
        specialty = provider.get("specialty", "Unknown")
        # Fields are read in the source's order, so a missing one gives the same KeyError.
        lines = [
            f"Appointment Details (ID: {appointment_id})",
            "",
            f"Patient: {_patient_name_or_default(patient)} (ID: {appt['patient_id']})",
            f"Provider: {_doctor_label(provider)} - {specialty} (ID: {appt['provider_id']})",
            "",
            "Appointment Information:",
            f"- Date: {appt['date']}",
            f"- Time: {appt['time']}",
            f"- Duration: {appt['duration_minutes']} minutes",
            f"- Type: {_titled(appt['type'])}",
            f"- Status: {_titled(appt['status'])}",
            "",
            "Clinical Information:",
            f"- Chief Complaint: {appt['chief_complaint']}",
            f"- Notes: {appt['notes']}",
            "",
            "Billing Information:",
            f"- Insurance Authorization: {appt['insurance_authorization']}",
            f"- Copay Amount: ${appt['copay_amount']:.2f}",
            "",
            "Meeting Information:",
            f"- Meeting Link: {appt['meeting_link']}",
        ]
        if "prescription_issued" in appt:
            rx = appt["prescription_issued"]
            lines += [
                "",
                "Prescription Issued:",
                f"- {rx['medication']} {rx['dosage']} {rx['frequency']}",
                f"- Quantity: {rx['quantity']}, Refills: {rx['refills']}",
            ]
        if "referral_from" in appt:
            lines += ["", f"Referral from: {appt['referral_from']}"]
        if "cancellation_reason" in appt:
            lines += [
                "",
                "Cancellation Details:",
                f"- Reason: {_titled(appt['cancellation_reason'])}",
                f"- Date: {appt['cancellation_date']}",
            ]
        return "\n".join(lines)


class GetProviderDetails:
    @staticmethod
    def invoke(data: Database, provider_id: str) -> str:
        providers = data["providers"]
        if provider_id not in providers:
            return f"Provider with ID {provider_id} not found."
        provider = providers[provider_id]
        contact = provider["contact"]
        schedule = provider["schedule"]
        lines = [
            f"Provider Details (ID: {provider_id})",
            "",
            f"Name: {_full_provider_name(provider)}",
            f"Specialty: {provider['specialty']}",
            f"License Number: {provider['license_number']}",
            f"Credentials: {', '.join(provider['credentials'])}",
            f"Years of Experience: {provider['years_experience']}",
            "",
            "Contact Information:",
            f"- Phone: {contact['phone']}",
            f"- Email: {contact['email']}",
            "",
            f"Languages: {', '.join(provider['languages'])}",
            f"Consultation Fee: ${provider['consultation_fee']:.2f}",
            "",
            "Weekly Schedule:",
        ]
        for day, times in schedule.items():
            lines.append(f"- {day.title()}: {', '.join(times) if times else 'Not available'}")
        return "\n".join(lines)


def _spaced_name(parts: list[Any], fallback: str) -> str:
    return " ".join(part for part in parts if part).strip() or fallback


class GetMedicalRecord:
    """A record by id, or the first record of an appointment."""

    @staticmethod
    def invoke(
        data: Database, record_id: str | None = None, appointment_id: str | None = None
    ) -> str:
        records = data["medical_records"]
        if not record_id and not appointment_id:
            return "Please provide a record_id or appointment_id to look up the medical record."
        if record_id:
            record = records.get(record_id)
            if record is None:
                return f"Medical record with ID {record_id} not found."
        else:
            record = next(
                (rec for rec in records.values() if rec.get("appointment_id") == appointment_id),
                None,
            )
            if record is None:
                return f"No medical record found for appointment ID {appointment_id}."
        appointment = data["appointments"].get(record.get("appointment_id", ""), {})
        patient_name = data["patients"].get(record.get("patient_id", ""), {}).get("name", {})
        provider_name = data["providers"].get(record.get("provider_id", ""), {}).get("name", {})
        patient_label = _spaced_name(
            [patient_name.get("first_name"), patient_name.get("last_name")], "Unknown Patient"
        )
        provider_label = _spaced_name(
            [provider_name.get(part) for part in ("title", "first_name", "last_name")],
            "Unknown Provider",
        )
        lines = [
            f"Medical Record (ID: {record['record_id']})",
            f"Patient: {patient_label} (ID: {record.get('patient_id', 'Unknown')})",
            f"Provider: {provider_label} (ID: {record.get('provider_id', 'Unknown')})",
        ]
        if appointment:
            lines.append(
                f"Related Appointment: {appointment.get('appointment_id', 'Unknown')} "
                f"on {appointment.get('date', 'Unknown Date')} "
                f"at {appointment.get('time', 'Unknown Time')}"
            )
        lines.append(f"Date: {record.get('date', 'Unknown Date')}")
        lines.append(f"Type: {record.get('type', 'Unknown')}")
        for section in ("subjective", "objective", "assessment", "plan"):
            if section in record:
                lines.append(f"{section.title()}: {record[section]}")
        if record.get("recommendations"):
            lines.append("Recommendations:")
            lines += [f"- {item}" for item in record["recommendations"]]
        return "\n".join(lines)


def _regimen_component(component: dict[str, Any]) -> str:
    return (
        f"{component.get('medication')} | dosage={component.get('dosage')} | "
        f"daily_dose={component.get('daily_dose')} | "
        f"monthly_units={component.get('monthly_units')} | "
        f"unit_type={component.get('unit_type')} | brand={component.get('preferred_brand')} | "
        f"supplier={component.get('supplier')} | "
        f"unit_cost_usd={component.get('unit_cost_usd'):.2f}"
    )


def _pill_burden(burden: dict[str, Any]) -> str:
    return (
        f"tablets_per_day={burden.get('tablets_per_day')} | "
        f"devices_per_month={burden.get('devices_per_month')}"
    )


class GetRegimenOptions:
    """A patient's current regimen and the optimized alternatives."""

    @staticmethod
    def invoke(data: Database, patient_id: str) -> str:
        plan = data["regimen_plans"].get(patient_id)
        if not plan:
            return f"No regimen optimization data available for patient {patient_id}."
        current = plan.get("current_regimen", {})
        lines = ["Current regimen components:"]
        lines += [f"- {_regimen_component(c)}" for c in current.get("components", [])]
        if current.get("pill_burden"):
            lines.append(f"Current pill burden: {_pill_burden(current['pill_burden'])}")
        if current.get("notes", []):
            lines.append("Current regimen notes:")
            lines += [f"  * {note}" for note in current["notes"]]
        lines.append("Optimized regimen options:")
        for number, option in enumerate(plan.get("optimized_regimens", []), start=1):
            lines.append(f"Option {number}: {option.get('name')}")
            lines.append(f"  Focus: {option.get('focus')}")
            lines += [f"  - {_regimen_component(c)}" for c in option.get("components", [])]
            if option.get("pill_burden"):
                lines.append(f"  Pill burden: {_pill_burden(option['pill_burden'])}")
            if option.get("synergy_notes", []):
                lines.append("  Synergy notes:")
                lines += [f"    - {note}" for note in option["synergy_notes"]]
        return "\n".join(lines)


def _record_date(record: dict[str, Any]) -> datetime.datetime:
    return datetime.datetime.strptime(record.get("date", "1900-01-01"), "%Y-%m-%d")


class ListPatientMedicalRecords:
    """A patient's records, newest first, one summary line each."""

    @staticmethod
    def invoke(data: Database, patient_id: str, limit: int | None = None) -> str:
        found = [r for r in data["medical_records"].values() if r.get("patient_id") == patient_id]
        if not found:
            return f"No medical records found for patient {patient_id}."
        found.sort(key=_record_date, reverse=True)
        if _wants_limit(limit):
            found = found[:limit]
        lines = []
        for record in found:
            prescriptions = record.get("prescriptions", [])
            medications = (
                ", ".join(item.get("medication") for item in prescriptions)
                if prescriptions
                else "None recorded"
            )
            lines.append(
                f"record_id={record['record_id']} | date={record['date']} | "
                f"appointment_id={record['appointment_id']} | medications={medications}"
            )
        return "Medical records (newest first):\n" + "\n".join(lines)


class ListAvailableProviders:
    """Providers, optionally those of one specialty (case-insensitive)."""

    @staticmethod
    def invoke(data: Database, specialty: str | None = None) -> str:
        matches = [
            (provider_id, provider)
            for provider_id, provider in data["providers"].items()
            if specialty is None or provider["specialty"].lower() == specialty.lower()
        ]
        if not matches:
            if specialty:
                return f"No providers found with specialty: {specialty}"
            return "No providers found."
        text = f"Available Providers{f' - {specialty}' if specialty else ''}:\n\n"
        for provider_id, provider in matches:
            text += (
                f"• {_full_provider_name(provider)} (ID: {provider_id})\n"
                f"  Specialty: {provider['specialty']}\n"
                f"  Experience: {provider['years_experience']} years\n"
                f"  Languages: {', '.join(provider['languages'])}\n"
                f"  Consultation Fee: ${provider['consultation_fee']:.2f}\n"
                f"  Phone: {provider['contact']['phone']}\n\n"
            )
        return text.strip()


def _appointment_when(item: tuple[str, dict[str, Any]]) -> tuple[datetime.datetime, str]:
    appointment_id, appointment = item
    stamp = f"{appointment.get('date', '0001-01-01')} {appointment.get('time', '00:00')}"
    try:
        when = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M")
    except ValueError:
        when = datetime.datetime.min
    return when, appointment_id


class ListPatientAppointments:
    """A patient's appointments in time order, optionally with one status."""

    @staticmethod
    def invoke(data: Database, patient_id: str, status_filter: str | None = None) -> str:
        patients = data["patients"]
        if patient_id not in patients:
            return f"Patient with ID {patient_id} not found."
        wanted = status_filter.lower() if status_filter else None
        mine = [
            (appointment_id, appointment)
            for appointment_id, appointment in data["appointments"].items()
            if appointment.get("patient_id") == patient_id
            and not (wanted and appointment.get("status", "").lower() != wanted)
        ]
        if not mine:
            if wanted:
                return (
                    f"No appointments found for patient {patient_id} with status {status_filter}."
                )
            return f"No appointments found for patient {patient_id}."
        mine.sort(key=_appointment_when)
        patient = patients[patient_id]
        header = (
            f"Appointments for {patient['name']['first_name']} {patient['name']['last_name']} "
            f"(ID: {patient_id})"
        )
        if wanted:
            header += f" with status {status_filter}"
        lines = [header]
        providers = data["providers"]
        for appointment_id, appointment in mine:
            provider = providers.get(appointment.get("provider_id", ""), {})
            name = provider.get("name", {})
            label = f"{name.get('title', 'Dr.')} {name.get('last_name', 'Unknown')}"
            specialty = provider.get("specialty", "Unknown Specialty")
            status = _titled(appointment.get("status", "Unknown"))
            kind = _titled(appointment.get("type", ""))
            lines.append(
                f"- {appointment_id}: {appointment.get('date')} at {appointment.get('time')} "
                f"with {label} ({specialty}) [{status}, Type: {kind}]"
            )
        return "\n".join(lines)


class ListMedicationSuppliers:
    """Suppliers of a medication, cheapest first, optionally of one country."""

    @staticmethod
    def invoke(
        data: Database, medication: str, country_filter: str | None = None, limit: int | None = None
    ) -> str:
        catalog = data["medication_suppliers"]
        by_lower = {name.lower(): name for name in catalog}
        key = by_lower.get(medication.lower())
        suppliers = catalog.get(key) if key else None
        if not suppliers:
            if key is None:
                return (
                    f"No supplier information found for {medication}. "
                    "(Tip: ensure the medication name matches the catalog)"
                )
            return f"No supplier information found for {medication}."
        if country_filter:
            suppliers = [
                item
                for item in suppliers
                if item.get("country", "").lower() == country_filter.lower()
            ]
            if not suppliers:
                return f"No suppliers in {country_filter} for {medication}."
        suppliers = sorted(suppliers, key=lambda item: item.get("price_usd", float("inf")))
        if _wants_limit(limit):
            suppliers = suppliers[:limit]
        lines = [
            f"{item.get('company')} ({item.get('country')}) | brand={item.get('brand_name')} | "
            f"price_usd={item.get('price_usd'):.2f}"
            for item in suppliers
        ]
        return f"Suppliers for {medication}:\n" + "\n".join(lines)


def _upload_in_window(entry: dict[str, Any], device_id: Any, start: Any, end: Any) -> bool:
    if entry.get("device_id") != device_id:
        return False
    day = entry.get("date")
    if start and day < start:
        return False
    return not (end and day > end)


class ListTelemetryUploads:
    """A device's uploads between optional dates, oldest first, as JSON."""

    @staticmethod
    def invoke(
        data: Database,
        device_id: str,
        start_date: str | None = None,
        end_date: str | None = None,
        limit: int | None = None,
    ) -> str:
        uploads = [
            entry
            for entry in data["telemetry_uploads"]
            if _upload_in_window(entry, device_id, start_date, end_date)
        ]
        uploads.sort(key=lambda entry: entry.get("date"))
        if _wants_limit(limit):
            uploads = uploads[:limit]
        if not uploads:
            return f"No telemetry uploads found for device {device_id} in the specified window."
        return json.dumps(uploads)


class _Interactions:
    """Pairwise lookups in the interaction table, case-insensitive on both names."""

    def __init__(self, table: Any) -> None:
        self.table = table
        self.canonical: dict[str, str] = {}
        for outer, inner in table.items():
            self.canonical.setdefault(outer.lower(), outer)
            for name in inner:
                self.canonical.setdefault(name.lower(), name)

    def name(self, medication: str) -> str:
        return self.canonical.get(medication.lower(), medication)

    def between(self, first: str, second: str) -> dict[str, Any] | None:
        a, b = self.name(first), self.name(second)
        for outer, inner in ((a, b), (b, a)):
            for candidate, details in self.table.get(outer, {}).items():
                if candidate.lower() == inner.lower():
                    return details
        return None


class CheckDrugInteractions:
    """Interactions of a medication with current ones and among the current ones."""

    @staticmethod
    def invoke(data: Database, primary_medication: str, current_medications: list[str]) -> str:
        lookup = _Interactions(data["drug_interactions"])
        lines: list[str] = []
        hold: set[str] = set()
        emergency: Any = False
        peak: Any = 0
        worst, worst_pair = "none", None

        def note(first: str, second: str) -> None:
            nonlocal emergency, peak, worst, worst_pair
            details = lookup.between(first, second)
            if not details:
                return
            severity = details.get("severity", "unknown")
            overlap = details.get("time_overlap_hours", 0)
            hold.update(details.get("skip", []))
            emergency = emergency or details.get("emergency", False)
            peak = max(peak, overlap)
            pair = f"{lookup.name(first)} + {lookup.name(second)}"
            lines.append(
                f"{pair}: severity={severity}, risk_score={details.get('risk_score')}, "
                f"overlap_hours={overlap}. {details.get('action', 'Monitor.')}"
            )
            if SEVERITY_RANK.get(severity, 0) > SEVERITY_RANK.get(worst, 0):
                worst, worst_pair = severity, pair

        for medication in current_medications:
            note(primary_medication, medication)
        for index, first in enumerate(current_medications):
            for second in current_medications[index + 1 :]:
                note(first, second)
        if not lines:
            return (
                "No documented high-risk interactions found for the supplied medications. "
                "Continue monitoring as per care plan."
            )
        summary = [
            "Drug interaction analysis:",
            *lines,
            "",
            f"Medications to hold today: {', '.join(sorted(hold)) if hold else 'None'}",
            f"Emergency escalation required: {'Yes' if emergency else 'No'}",
            f"Peak overlap risk window (hours): {peak}",
        ]
        if worst_pair:
            summary.append(f"Highest severity interaction: {worst_pair} ({worst})")
        return "\n".join(summary)


class ScheduleAppointment:
    """Book a free slot of a provider: id ``APPT<max + 1>``, insurance or self-pay/voucher."""

    @staticmethod
    def invoke(
        data: Database,
        patient_id: str,
        provider_id: str,
        date: str,
        time: str,
        appointment_type: str,
        bill_insurance: bool = True,
        voucher_id: str | None = None,
        payment_notes: str | None = None,
    ) -> str:
        patients, providers = data["patients"], data["providers"]
        appointments = data["appointments"]
        if patient_id not in patients:
            return f"Patient with ID {patient_id} not found."
        if provider_id not in providers:
            return f"Provider with ID {provider_id} not found."
        patient, provider = patients[patient_id], providers[provider_id]
        problem = _slot_problem(provider_id, provider, date, time)
        if problem:
            return problem
        if any(_booked(appt, provider_id, date, time) for appt in appointments.values()):
            return _double_booking(provider_id, date, time)
        numbers = [int(key.replace("APPT", "")) for key in appointments if key.startswith("APPT")]
        number = max(numbers) + 1 if numbers else 1
        appointment_id = f"APPT{number:03d}"
        insurance = patient["insurance"]["primary"]
        primary_care = provider["specialty"] == "Primary Care"
        copay_due = insurance["copay_primary"] if primary_care else insurance["copay_specialist"]
        if bill_insurance:
            copay, method, voucher, authorization = (
                copay_due,
                "insurance",
                None,
                f"AUTH{number:06d}",
            )
        else:
            method = "telehealth_voucher" if voucher_id else "self_pay"
            copay, voucher, authorization = 0.0, voucher_id, None
        meeting_link = f"https://telehealth.healthcenter.com/room/{appointment_id}"
        appointments[appointment_id] = {
            "appointment_id": appointment_id,
            "patient_id": patient_id,
            "provider_id": provider_id,
            "date": date,
            "time": time,
            "duration_minutes": 30,
            "type": _detached(appointment_type),
            "status": "scheduled",
            "notes": _detached(payment_notes or ""),
            "insurance_authorization": authorization,
            "copay_amount": copay,
            "meeting_link": meeting_link,
            "payment_method": method,
            "voucher_id": _detached(voucher),
            "insurance_billed": bool(bill_insurance),
        }
        lines = [
            "Appointment successfully scheduled!",
            "",
            f"Appointment ID: {appointment_id}",
            f"Patient: {patient['name']['first_name']} {patient['name']['last_name']}",
            f"Provider: Dr. {provider['name']['last_name']} - {provider['specialty']}",
            f"Date: {date}",
            f"Time: {time}",
            f"Type: {_titled(appointment_type)}",
        ]
        if bill_insurance:
            lines += [f"Copay: ${copay:.2f}", f"Insurance Authorization: {authorization}"]
        else:
            lines += ["Insurance Billing: Skipped", f"Payment Method: {_titled(method)}"]
            if voucher:
                lines.append(f"Voucher Applied: {voucher}")
            lines.append(f"Amount Due Today: ${copay:.2f}")
            if payment_notes:
                lines.append(f"Billing Notes: {payment_notes}")
        lines += [
            f"Meeting Link: {meeting_link}",
            "",
            "Please save your appointment ID for future reference.",
        ]
        return "\n".join(lines)


class CancelAppointment:
    """Cancel a scheduled appointment, stamping ``data.clock()``'s date."""

    @staticmethod
    def invoke(data: Database, appointment_id: str) -> str:
        appointments = data["appointments"]
        if appointment_id not in appointments:
            return _appointment_missing(appointment_id)
        status = appointments[appointment_id]["status"]
        if status == "cancelled":
            return f"Appointment {appointment_id} is already cancelled."
        if status == "completed":
            return (
                f"Cannot cancel appointment {appointment_id} - "
                "appointment has already been completed."
            )
        appt = appointments.mutable(appointment_id)
        appt["status"] = "cancelled"
        appt["cancellation_reason"] = "patient_cancelled"
        appt["cancellation_date"] = data.clock().strftime("%Y-%m-%d")
        patient = data["patients"].get(appt["patient_id"], {})
        provider = data["providers"].get(appt["provider_id"], {})
        return "\n".join(
            [
                "Appointment successfully cancelled.",
                "",
                f"Appointment ID: {appointment_id}",
                f"Patient: {_patient_name_or_default(patient)}",
                f"Provider: {_doctor_label(provider)}",
                f"Original Date/Time: {appt['date']} at {appt['time']}",
                f"Cancellation Reason: {_titled(appt['cancellation_reason'])}",
                f"Cancellation Date: {appt['cancellation_date']}",
                "",
                "The appointment slot is now available for other patients. If this was a patient "
                "cancellation, please remind them of the cancellation policy.",
            ]
        )


class RescheduleAppointment:
    """Move an active appointment to a free slot of the same provider."""

    @staticmethod
    def invoke(data: Database, appointment_id: str, new_date: str, new_time: str) -> str:
        appointments = data["appointments"]
        if appointment_id not in appointments:
            return _appointment_missing(appointment_id)
        current = appointments[appointment_id]
        if current["status"] == "cancelled":
            return (
                f"Cannot reschedule appointment {appointment_id} - appointment has been cancelled."
            )
        if current["status"] == "completed":
            return (
                f"Cannot reschedule appointment {appointment_id} - "
                "appointment has already been completed."
            )
        provider_id = current["provider_id"]
        provider = data["providers"][provider_id]
        problem = _slot_problem(provider_id, provider, new_date, new_time)
        if problem:
            return problem
        for other_id, other in appointments.items():
            if other_id != appointment_id and _booked(other, provider_id, new_date, new_time):
                return _double_booking(provider_id, new_date, new_time)
        old_date, old_time = current["date"], current["time"]
        appt = appointments.mutable(appointment_id)
        appt["date"] = new_date
        appt["time"] = new_time
        patient = data["patients"].get(appt["patient_id"], {})
        # The meeting link is read last: without one the move stays and the call fails.
        return "\n".join(
            [
                "Appointment successfully rescheduled.",
                "",
                f"Appointment ID: {appointment_id}",
                f"Patient: {_patient_name_or_default(patient)}",
                f"Provider: {_doctor_label(provider)} - {provider['specialty']}",
                "",
                f"Previous Date/Time: {old_date} at {old_time}",
                f"New Date/Time: {new_date} at {new_time}",
                "",
                f"Meeting Link: {appt['meeting_link']}",
                "",
                "Please update your calendar with the new appointment time.",
            ]
        )


class TransferToHumanSupport:
    """``transfer_to_human_support``: telehealth's terminate tool."""

    @staticmethod
    def invoke(data: Database, reason: str) -> str:
        return "\n".join(
            [
                "Transferring you to a human support representative.",
                "",
                f"Reason for transfer: {reason}",
                "",
                "Please hold while we connect you to a member of our support team. They will be "
                "able to assist you with your request.",
                "",
                "Estimated wait time: 2-3 minutes.",
                "",
                "Thank you for your patience.",
            ]
        )


def _prescription_index(prescriptions: list[dict[str, Any]], medication: str) -> int | None:
    """Index of the prescription for ``medication``: exact name, else a prefix either way."""
    by_name: dict[str, int] = {}
    for index, prescription in enumerate(prescriptions):
        by_name[prescription.get("medication", "").strip().lower()] = index  # last one wins
    wanted = medication.strip().lower()
    if wanted in by_name:
        return by_name[wanted]
    for name, index in by_name.items():
        if wanted.startswith(name) or name.startswith(wanted):
            return index
    return None


class UpdatePrescriptionSupplier:
    """Point a record's prescription at a supplier and brand, with its price."""

    @staticmethod
    def invoke(
        data: Database,
        record_id: str,
        medication: str,
        supplier_company: str,
        brand_name: str,
        price_usd: float,
        currency: str = "USD",
    ) -> str:
        records = data["medical_records"]
        if record_id not in records:
            return "Error: medical record not found"
        prescriptions = records[record_id].get("prescriptions", [])
        if not prescriptions:
            return "Error: medical record has no prescriptions"
        index = _prescription_index(prescriptions, medication)
        if index is None:
            return f"Error: medication {medication} not found in record {record_id}"
        record = records.mutable(record_id)
        prescription = record["prescriptions"][index]
        prescription["pharmacy"] = f"{supplier_company} ({brand_name})"
        # float() fails after the pharmacy was written; the source keeps that partial change.
        prescription["supplier"] = {
            "company": _detached(supplier_company),
            "brand_name": _detached(brand_name),
            "price_usd": float(price_usd),
            "currency": _detached(currency),
        }
        return json.dumps(record)


class ListTelemetryDevices:
    """Telemetry inventory sorted by device id, optionally with one status."""

    @staticmethod
    def invoke(data: Database, status_filter: str | None = None, limit: int | None = None) -> str:
        devices = data["telemetry_inventory"]
        if not devices:
            return "Telemetry inventory is empty."
        if status_filter:
            devices = [
                item for item in devices if item.get("status", "").lower() == status_filter.lower()
            ]
            if not devices:
                return f"No telemetry devices with status {status_filter}."
        devices = sorted(devices, key=lambda item: item.get("device_id", ""))
        if _wants_limit(limit):
            devices = devices[:limit]
        lines = [
            f"{item.get('device_id')} | status={item.get('status')} | "
            f"last_audit={item.get('last_audit')} | notes={item.get('notes')}"
            for item in devices
        ]
        return "Telemetry devices:\n" + "\n".join(lines)


class GetTelemetryUpload:
    """One device's upload on one date, as JSON."""

    @staticmethod
    def invoke(data: Database, device_id: str, date: str) -> str:
        for entry in data["telemetry_uploads"]:
            if entry.get("device_id") == device_id and entry.get("date") == date:
                return json.dumps(entry)
        return f"No telemetry upload found for device {device_id} on {date}."


class UpdateMedicalRecordNote:
    """Append ``{"note": ..., "metadata": ...}`` to a record's notes."""

    @staticmethod
    def invoke(
        data: Database, record_id: str, note: str, metadata: dict[str, Any] | None = None
    ) -> str:
        records = data["medical_records"]
        if not records.get(record_id):
            return f"Error: medical record {record_id} not found"
        record = records.mutable(record_id)
        entry = {"note": _detached(note)}
        if metadata:
            entry["metadata"] = _detached(metadata)
        record.setdefault("notes", []).append(entry)
        return json.dumps(record)


SPEC = register(
    DomainSpec(
        name="telehealth",
        tools=(
            FindPatientByEmail,
            FindPatientByNameDOB,
            GetPatientDetails,
            GetAppointmentDetails,
            GetProviderDetails,
            GetMedicalRecord,
            GetRegimenOptions,
            ListPatientMedicalRecords,
            ListAvailableProviders,
            ListPatientAppointments,
            ListMedicationSuppliers,
            ListTelemetryUploads,
            CheckDrugInteractions,
            ScheduleAppointment,
            CancelAppointment,
            RescheduleAppointment,
            Calculate,
            Think,
            TransferToHumanSupport,
            UpdatePrescriptionSupplier,
            ListTelemetryDevices,
            GetTelemetryUpload,
            UpdateMedicalRecordNote,
        ),
        terminate_tools=("transfer_to_human_support",),
        write_tools=frozenset(
            {
                "schedule_appointment",
                "cancel_appointment",
                "reschedule_appointment",
                "update_prescription_supplier",
                "update_medical_record_note",
            }
        ),
    )
)
