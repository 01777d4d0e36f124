"""tau-trait's telecom domain: customer accounts, services, devices, billing and support tickets.

Reimplements the 18 tools that ``tau_trait/envs/telecom/env.py`` exposes (its ``ALL_TOOLS``),
with the source's keyword arguments, observation strings, state changes and exceptions,
including its quirks:

* the env lists ``transfer_to_human_support`` as a terminate tool but does not expose it (the tool
  only exists among the source's retired tools), so calling it gives "Unknown action" and a
  telecom episode never ends through a terminate tool;
* new ids are deterministic: tickets ``TICKET<number of tickets + 1>``, a customer's new device
  ``str(len(devices) + 1)`` (which can repeat an existing id);
* ``troubleshoot_device`` on a TV with any issue but ``no_service`` compares against an enum
  member that does not exist and fails with that attribute error;
* ``manage_service`` can change state before a later step fails (an unknown device id after
  others were assigned; a service removed whose charge is not billed), and the partial change
  stays.

Tools follow the copy-on-write contract of :mod:`cast_rl.envs.db`; values taken from the
caller's kwargs are deep-copied before they are stored, so the database never aliases them.
"""

from __future__ import annotations

import copy
import json
from enum import Enum
from typing import Any

from cast_rl.envs.db import Database
from cast_rl.envs.domain import DomainSpec, register
from cast_rl.envs.domains.common import Calculate, Think

TICKET_CATEGORIES = [
    "mobile",
    "internet",
    "tv",
    "billing",
    "account",
    "device",
    "security",
    "phone",
]
TICKET_PRIORITIES = ["low", "medium", "high", "urgent"]


def _detached(value: Any) -> Any:
    """A copy of a caller-supplied value that the database may own."""
    return copy.deepcopy(value)


def _customer_missing(customer_id: Any) -> str:
    return f"Error: Customer not found: {customer_id}"


def _billing_missing(customer_id: Any) -> str:
    return f"Error: No billing information found for customer: {customer_id}"


class FindCustomerByEmail:
    """Customer id whose e-mail matches case-insensitively."""

    @staticmethod
    def invoke(data: Database, email: str) -> str:
        for customer_id, customer in data["customers"].items():
            # The caller's value is lowered inside the loop: a non-string fails only if a
            # customer exists to compare with, as in the source.
            if customer.get("demographics", {}).get("email", "").lower() == email.lower():
                return customer_id
        return f"Error: No customer found with email address: {email}"


def _digits(text: Any) -> str:
    return "".join(filter(str.isdigit, text))


class FindCustomerByPhone:
    """Customer id whose phone number has the same digits."""

    @staticmethod
    def invoke(data: Database, phone: str) -> str:
        wanted = _digits(phone)
        for customer_id, customer in data["customers"].items():
            if _digits(customer.get("demographics", {}).get("phone", "")) == wanted:
                return customer_id
        return f"Error: No customer found with phone number: {phone}"


class GetCustomerDetails:
    @staticmethod
    def invoke(data: Database, customer_id: str) -> str:
        customers = data["customers"]
        if customer_id not in customers:
            return _customer_missing(customer_id)
        return json.dumps(customers[customer_id])


class GetServiceDetails:
    @staticmethod
    def invoke(data: Database, service_id: str) -> str:
        services = data["services"]
        if service_id not in services:
            return f"Error: Service not found: {service_id}"
        return json.dumps(services[service_id])


class GetDeviceDetails:
    @staticmethod
    def invoke(data: Database, device_name: str) -> str:
        devices = data["devices"]
        if device_name not in devices:
            return f"Error: Device not found: {device_name}"
        return json.dumps(devices[device_name])


class GetBillingDetails:
    @staticmethod
    def invoke(data: Database, customer_id: str) -> str:
        billing = data["billing"]
        if customer_id not in billing:
            return _billing_missing(customer_id)
        return json.dumps(billing[customer_id])


def _list_services(data: Database, customer_id: str) -> str:
    services = data["services"]
    owned = data["customers"][customer_id].get("services", [])
    listed = [services[service_id] for service_id in owned if service_id in services]
    return json.dumps({"customer_id": customer_id, "services": listed})


def _add_service(data: Database, customer_id: str, service_id: Any, devices_ids: Any) -> str:
    services = data["services"]
    if service_id not in services:
        return f"Error: Service not found: {service_id}"
    if service_id in data["customers"][customer_id].get("services", []):
        return f"Error: Customer {customer_id} already has service: {service_id}"
    # Devices are assigned one by one and an unknown id stops the loop: earlier assignments stay.
    customer = data["customers"].mutable(customer_id)
    devices = customer.get("devices", [])
    if devices_ids:
        for device_id in devices_ids:
            if device_id not in [device["device_id"] for device in devices]:
                return f"Error: Device not found: {device_id} in devices {devices}"
            target = next(device for device in devices if device["device_id"] == device_id)
            target["service"] = service_id
    customer.get("services", []).append(service_id)
    service = services.get(service_id, {})
    if isinstance(data["billing"].get(customer_id), dict):
        entry = data["billing"].mutable(customer_id)
        entry["monthly_charges"][service_id] = service.get("price", 0.0)
    return f"Success: Added service '{service.get('name', service_id)}' to customer {customer_id}"


def _remove_service(data: Database, customer_id: str, service_id: Any) -> str:
    if service_id not in data["customers"][customer_id].get("services", []):
        return f"Error: Customer {customer_id} does not have service: {service_id}"
    customer = data["customers"].mutable(customer_id)
    released = []
    for device in customer.get("devices", []):
        if device.get("service") == service_id:
            device["service"] = None
            released.append(device.get("name"))
    customer.get("services", []).remove(service_id)
    service_name = data["services"].get(service_id, {}).get("name", service_id)
    if isinstance(data["billing"].get(customer_id), dict):
        # Fails with KeyError when the charge is missing, after the customer was changed.
        data["billing"].mutable(customer_id)["monthly_charges"].pop(service_id)
    return (
        f"Success: Removed service '{service_name}' from customer {customer_id}. "
        f"Devices {released} are now no longer associated with the service."
    )


class ManageService:
    """List, add or remove a customer's services (and point devices at an added service)."""

    @staticmethod
    def invoke(
        data: Database,
        customer_id: str,
        action: str,
        service_id: str | None = None,
        devices_ids: list[str] | None = None,
    ) -> str:
        if customer_id not in data["customers"]:
            return _customer_missing(customer_id)
        if action == "list":
            return _list_services(data, customer_id)
        if not service_id:
            return f"Error: Service ID is required for action: {action}"
        if action == "add":
            return _add_service(data, customer_id, service_id, devices_ids)
        if action == "remove":
            return _remove_service(data, customer_id, service_id)
        return f"Error: Invalid action: {action}. Valid actions are: add, remove, list"


class Issue(Enum):
    """Issue kinds ``troubleshoot_device`` accepts (the enum's name shows in its ValueError)."""

    NO_SERVICE = "no_service"
    SLOW_SPEEDS = "slow_speeds"
    BATTERY_DRAIN = "battery_drain"


_PHONE_STEPS = {
    Issue.BATTERY_DRAIN: (
        "Restart device ",
        "Check brightness settings and reduce if needed",
        "Close background apps",
        "Contact support if issue persists",
    ),
    Issue.NO_SERVICE: (
        "Restart device ",
        "Check signal coverage ",
        "Reset network settings ",
        "Contact support if issue persists",
    ),
    Issue.SLOW_SPEEDS: (
        "Restart device ",
        "Check data usage and plan limits",
        "Reset network settings ",
        "Contact support if issue persists",
    ),
}
_ROUTER_STEPS = {
    Issue.NO_SERVICE: (
        "Restart router by unplugging for 30 seconds",
        "Check all cable connections ",
        "Update firmware if available",
        "Contact support if needed",
    ),
    Issue.SLOW_SPEEDS: (
        "Restart router by unplugging for 30 seconds",
        "Check cable connections ",
        "Run speed test ",
        "Contact support if needed",
    ),
}
_TV_NO_SERVICE_STEPS = (
    "Check correct input/source ",
    "Verify cable connections ",
    "Restart cable box ",
    "Contact support if needed",
)
_UNDEFINED_TV_ISSUE = "NO_SIGNAL"
UNKNOWN_ISSUE = "Unknown issue"


def _steps_text(steps: tuple[str, ...]) -> str:
    numbered = "".join(f"{i}) {step}\n" for i, step in enumerate(steps, start=1))
    return f"\nTroubleshooting steps: \n{numbered}"


class TroubleshootDevice:
    """Canned troubleshooting steps by device category and issue."""

    @staticmethod
    def invoke(data: Database, device_name: str, issue: str) -> str:
        kind = Issue(issue)  # ValueError "'x' is not a valid Issue" comes first, as in the source
        devices = data["devices"]
        if device_name not in devices:
            return f"Error: Device not found: {device_name}"
        category = devices[device_name].get("category", "")
        if category in ("mobile_phone", "phone"):
            steps = _PHONE_STEPS.get(kind)
        elif category == "networking":
            steps = _ROUTER_STEPS.get(kind)
        elif category == "tv":
            if kind != Issue.NO_SERVICE:
                # The source also accepts a NO_SIGNAL member that Issue does not define, so
                # every other issue raises AttributeError here; keep that observable failure.
                getattr(Issue, _UNDEFINED_TV_ISSUE)
            steps = _TV_NO_SERVICE_STEPS
        else:
            steps = None
        return _steps_text(steps) if steps else UNKNOWN_ISSUE


class CreateSupportTicket:
    """Open a ticket with id ``TICKET<count + 1>`` (zero-padded to three digits)."""

    @staticmethod
    def invoke(data: Database, customer_id: str, category: str, priority: str = "medium") -> str:
        tickets = data["support_tickets"]
        if customer_id not in data["customers"]:
            return _customer_missing(customer_id)
        if category not in TICKET_CATEGORIES:
            return (
                f"Error: Invalid category: {category}. "
                f"Valid categories: {', '.join(TICKET_CATEGORIES)}"
            )
        if priority not in TICKET_PRIORITIES:
            return (
                f"Error: Invalid priority: {priority}. "
                f"Valid priorities: {', '.join(TICKET_PRIORITIES)}"
            )
        ticket_id = f"TICKET{len(tickets) + 1:03d}"
        tickets[ticket_id] = {
            "ticket_id": ticket_id,
            "customer_id": customer_id,
            "status": "open",
            "priority": priority,
            "category": category,
        }
        return f"Success: Created support ticket {ticket_id} for customer {customer_id}"


class GetSupportTicketDetails:
    @staticmethod
    def invoke(data: Database, ticket_id: str) -> str:
        tickets = data["support_tickets"]
        if ticket_id not in tickets:
            return f"Error: Support ticket not found: {ticket_id}"
        return json.dumps(tickets[ticket_id])


class AddDevice:
    """Give a customer a catalog device with id ``len(devices) + 1`` and no service."""

    @staticmethod
    def invoke(data: Database, customer_id: str, device_name: str) -> str:
        customers = data["customers"]
        if customer_id not in customers:
            return _customer_missing(customer_id)
        if device_name not in data["devices"]:
            return f"Error: Invalid device name: {device_name}"
        customer = customers.mutable(customer_id)
        devices = customer.get("devices", [])
        devices.append({"device_id": str(len(devices) + 1), "name": device_name, "service": None})
        return f"Success: Added device '{device_name}' to customer {customer_id}"


class ManageBilling:
    """Overwrite a customer's paperless, auto-pay and billing-cycle settings (no validation)."""

    @staticmethod
    def invoke(
        data: Database, customer_id: str, paperless: bool, auto_pay: bool, billing_cycle: str
    ) -> str:
        if customer_id not in data["customers"]:
            return _customer_missing(customer_id)
        entry = data["billing"].mutable(customer_id)  # KeyError when there is no billing record
        entry["paperless"] = _detached(paperless)
        entry["auto_pay"] = _detached(auto_pay)
        entry["billing_cycle"] = _detached(billing_cycle)
        return json.dumps({"customer_id": customer_id, "billing": entry})


class GetServices:
    """The whole service catalog."""

    @staticmethod
    def invoke(data: Database) -> str:
        return json.dumps(data["services"].to_dict())


class GetSeniorDiscount:
    """The price less a flat 5.00, floored at zero, with two decimals."""

    @staticmethod
    def invoke(data: Database, original_price: str) -> str:
        try:
            price = float(original_price)
        except (TypeError, ValueError):
            return "Error: original_price must be a number"
        return f"{max(price - 5.0, 0.0):.2f}"


class ModifySupportTicket:
    """Overwrite a ticket's status and priority (no validation)."""

    @staticmethod
    def invoke(data: Database, ticket_id: str, status: str, priority: str) -> str:
        tickets = data["support_tickets"]
        if ticket_id not in tickets:
            return f"Error: Support ticket not found: {ticket_id}"
        ticket = tickets.mutable(ticket_id)
        ticket["status"] = _detached(status)
        ticket["priority"] = _detached(priority)
        return (
            f"Success: Modified support ticket {ticket_id} "
            f"with status {status} and priority {priority}"
        )


class RecordPayment:
    """Apply a payment: lower the balance (not below zero), log it, set ``last_payment``."""

    @staticmethod
    def invoke(
        data: Database, customer_id: str, amount: float | int | str, method: str, date: str
    ) -> str:
        billing = data["billing"]
        if customer_id not in billing:
            return _billing_missing(customer_id)
        try:
            paid = round(float(amount), 2)
        except (TypeError, ValueError):
            return "Error: amount must be a number"
        entry = billing.mutable(customer_id)
        balance = max(round(float(entry.get("current_balance", 0.0)) - paid, 2), 0.0)
        entry["current_balance"] = balance
        entry.setdefault("payment_history", []).append(
            {"date": _detached(date), "amount": paid, "status": "completed"}
        )
        entry["last_payment"] = {
            "amount": paid,
            "date": _detached(date),
            "method": _detached(method),
            "status": "completed",
        }
        receipt = {
            "customer_id": customer_id,
            "amount": f"{paid:.2f}",
            "method": method,
            "date": date,
            "current_balance": f"{balance:.2f}",
        }
        return json.dumps(receipt)


SPEC = register(
    DomainSpec(
        name="telecom",
        tools=(
            Calculate,
            Think,
            FindCustomerByEmail,
            FindCustomerByPhone,
            GetCustomerDetails,
            GetServiceDetails,
            GetDeviceDetails,
            GetBillingDetails,
            ManageService,
            TroubleshootDevice,
            CreateSupportTicket,
            GetSupportTicketDetails,
            AddDevice,
            ManageBilling,
            GetServices,
            GetSeniorDiscount,
            ModifySupportTicket,
            RecordPayment,
        ),
        terminate_tools=("transfer_to_human_support",),
        write_tools=frozenset(
            {
                "manage_service",
                "create_support_ticket",
                "add_device",
                "manage_billing",
                "modify_support_ticket",
                "record_payment",
            }
        ),
    )
)
