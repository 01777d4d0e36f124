"""tau-bench airline domain: 14 tools over flights, reservations and users.

Behaviour follows ``tau_bench/envs/airline/tools`` of sierra-research/tau-bench exactly: the same
tool classes, keyword arguments, observation strings, state changes and exceptions (the env turns
an exception into ``"Error: <exc>"``, so checks run in the source's order and a bad input fails
at the same point with the same text).  Quirks kept on purpose:

* ``book_reservation`` names the new reservation ``HATHAT``, else ``HATHAU``, else ``HATHAV``
  (a fourth booking overwrites ``HATHAV``), stamps the fixed ``created_at`` 2024-05-15T15:00:00,
  never changes seat counts, checks each gift card or certificate against its balance separately
  (two payments from one gift card may overdraw it) and deletes a used certificate; paying twice
  with one certificate raises ``KeyError`` after the earlier payments were already taken.
* ``get_reservation_details`` says ``"Error: user not found"`` for an unknown reservation.
* ``search_onestop_flight`` dates an overnight second leg ``2024-05-{day+1}`` (no zero padding,
  always May) and fills that leg's status, seats and prices from the first leg's date.
* ``send_certificate`` returns ``None`` once the user holds all three certificate ids it hands
  out (``certificate_3221322`` to ``certificate_3221324``).
* ``update_reservation_flights`` keeps the old price of an unchanged flight only when the cabin is
  unchanged, and a negative difference is refunded (a gift card's balance grows).
* ``cancel_reservation`` appends a negated copy of every payment so far, even when the reservation
  is already cancelled.

The source stores the caller's ``passengers`` and ``payment_methods`` lists in the database by
reference; only their values are observable to an agent, so we store deep copies and never let
later writes reach the caller's kwargs.  All writes go through the copy-on-write contract of
:mod:`cast_rl.envs.db` (``mutable`` before changing a user or reservation; no tool changes flights).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from cast_rl.envs.db import Database
from cast_rl.envs.domain import DomainSpec, register
from cast_rl.envs.domains.common import Calculate, Think, TransferToHumanAgents

BOOKING_TIME = "2024-05-15T15:00:00"
"""``created_at`` of every new reservation: the "current time" that the airline policy states."""
NEW_RESERVATION_IDS = ("HATHAT", "HATHAU", "HATHAV")
CERTIFICATE_NUMBERS = (3221322, 3221323, 3221324)
INSURANCE_PER_PASSENGER = 30
NONFREE_BAG_PRICE = 50
AIRPORTS = {
    "SFO": "San Francisco",
    "JFK": "New York",
    "LAX": "Los Angeles",
    "ORD": "Chicago",
    "DFW": "Dallas",
    "DEN": "Denver",
    "SEA": "Seattle",
    "ATL": "Atlanta",
    "MIA": "Miami",
    "BOS": "Boston",
    "PHX": "Phoenix",
    "IAH": "Houston",
    "LAS": "Las Vegas",
    "MCO": "Orlando",
    "EWR": "Newark",
    "CLT": "Charlotte",
    "MSP": "Minneapolis",
    "DTW": "Detroit",
    "PHL": "Philadelphia",
    "LGA": "LaGuardia",
}


# -- shared checks and payment logic ------------------------------------------------------------


def _price_new_flight(
    data: Database, flight: dict[str, Any], cabin: Any, passengers: Any
) -> str | None:
    """Check that ``flight`` can be booked in ``cabin`` and fill in its price, origin, destination.

    Returns the source's error observation, or ``None`` after writing ``price``, ``origin`` and
    ``destination`` into ``flight`` (a private copy of the caller's dict).  ``len(passengers)`` is
    taken only after the seat lookup, as in the source, so a bad cabin is reported first.
    """
    flight_number = flight["flight_number"]
    if flight_number not in data["flights"]:
        return f"Error: flight {flight_number} not found"
    flight_data = data["flights"][flight_number]
    if flight["date"] not in flight_data["dates"]:
        return f"Error: flight {flight_number} not found on date {flight['date']}"
    on_date = flight_data["dates"][flight["date"]]
    if on_date["status"] != "available":
        return f"Error: flight {flight_number} not available on date {flight['date']}"
    if on_date["available_seats"][cabin] < len(passengers):
        return f"Error: not enough seats on flight {flight_number}"
    flight["price"] = on_date["prices"][cabin]
    flight["origin"] = flight_data["origin"]
    flight["destination"] = flight_data["destination"]
    return None


def _update_payment_error(
    payment_methods: Mapping[str, Any], payment_id: Any, total_price: Any
) -> str | None:
    """The payment check shared by ``update_reservation_flights`` and ``..._baggages``."""
    if payment_id not in payment_methods:
        return "Error: payment method not found"
    method = payment_methods[payment_id]
    if method["source"] == "certificate":
        return "Error: certificate cannot be used to update reservation"
    if method["source"] == "gift_card" and method["amount"] < total_price:
        return "Error: gift card balance is not enough"
    return None


def _charge_gift_card(data: Database, user_id: str, payment_id: str, amount: Any) -> None:
    """Take ``amount`` (negative: a refund) from a gift card; other sources keep no balance."""
    if data["users"][user_id]["payment_methods"][payment_id]["source"] == "gift_card":
        data["users"].mutable(user_id)["payment_methods"][payment_id]["amount"] -= amount


def _record_payment(reservation: dict[str, Any], payment_id: Any, amount: Any) -> None:
    """Append a non-zero charge or refund to a (mutable) reservation's payment history."""
    if amount != 0:
        reservation["payment_history"].append({"payment_id": payment_id, "amount": amount})


def _unchanged_flights(
    reservation: Mapping[str, Any], flight: Any, cabin: Any
) -> list[dict[str, Any]]:
    """Flights of the reservation equal to ``flight`` (number and date) when the cabin stays.

    Every reservation flight is compared, in order and with the source's short-circuit order, so
    a malformed ``flight`` raises the same exception at the same point as the source.
    """
    return [
        old
        for old in reservation["flights"]
        if old["flight_number"] == flight["flight_number"]
        and old["date"] == flight["date"]
        and cabin == reservation["cabin"]
    ]


# -- tools --------------------------------------------------------------------------------------


class BookReservation:
    """``book_reservation``: validate flights, seats and payment, then charge and store."""

    @staticmethod
    def invoke(
        data: Database,
        user_id: str,
        origin: str,
        destination: str,
        flight_type: str,
        cabin: str,
        flights: list[dict[str, Any]],
        passengers: list[dict[str, Any]],
        payment_methods: list[dict[str, Any]],
        total_baggages: int,
        nonfree_baggages: int,
        insurance: str,
    ) -> str:
        reservations, users = data["reservations"], data["users"]
        if user_id not in users:
            return "Error: user not found"
        user = users[user_id]
        reservation_id = next(
            (rid for rid in NEW_RESERVATION_IDS[:-1] if rid not in reservations),
            NEW_RESERVATION_IDS[-1],
        )
        reservation = {
            "reservation_id": reservation_id,
            "user_id": user_id,
            "origin": origin,
            "destination": destination,
            "flight_type": flight_type,
            "cabin": cabin,
            "flights": copy.deepcopy(flights),
            "passengers": copy.deepcopy(passengers),
            "payment_history": copy.deepcopy(payment_methods),
            "created_at": BOOKING_TIME,
            "total_baggages": total_baggages,
            "nonfree_baggages": nonfree_baggages,
            "insurance": insurance,
        }

        total_price = 0
        for flight in reservation["flights"]:
            error = _price_new_flight(data, flight, cabin, passengers)
            if error is not None:
                return error
            total_price += flight["price"] * len(passengers)
        if insurance == "yes":
            total_price += INSURANCE_PER_PASSENGER * len(passengers)
        total_price += NONFREE_BAG_PRICE * nonfree_baggages

        for payment in payment_methods:
            payment_id, amount = payment["payment_id"], payment["amount"]
            if payment_id not in user["payment_methods"]:
                return f"Error: payment method {payment_id} not found"
            method = user["payment_methods"][payment_id]
            if method["source"] in ("gift_card", "certificate") and method["amount"] < amount:
                return f"Error: not enough balance in payment method {payment_id}"
        if sum(payment["amount"] for payment in payment_methods) != total_price:
            paid = sum(payment["amount"] for payment in payment_methods)
            return (
                "Error: payment amount does not add up, "
                f"total price is {total_price}, but paid {paid}"
            )

        user = users.mutable(user_id)
        for payment in payment_methods:
            payment_id, amount = payment["payment_id"], payment["amount"]
            # A certificate used twice is gone by its second payment: KeyError, as in the source.
            source = user["payment_methods"][payment_id]["source"]
            if source == "gift_card":
                user["payment_methods"][payment_id]["amount"] -= amount
            elif source == "certificate":
                del user["payment_methods"][payment_id]
        reservations[reservation_id] = reservation
        user["reservations"].append(reservation_id)
        return json.dumps(reservation)


class CancelReservation:
    """``cancel_reservation``: refund every payment so far and mark the reservation cancelled."""

    @staticmethod
    def invoke(data: Database, reservation_id: str) -> str:
        reservations = data["reservations"]
        if reservation_id not in reservations:
            return "Error: reservation not found"
        reservation = reservations.mutable(reservation_id)
        refunds = [
            {"payment_id": payment["payment_id"], "amount": -payment["amount"]}
            for payment in reservation["payment_history"]
        ]
        reservation["payment_history"].extend(refunds)
        reservation["status"] = "cancelled"
        return json.dumps(reservation)


class GetReservationDetails:
    """``get_reservation_details``: the reservation as JSON (unknown id: "user not found")."""

    @staticmethod
    def invoke(data: Database, reservation_id: str) -> str:
        reservations = data["reservations"]
        if reservation_id in reservations:
            return json.dumps(reservations[reservation_id])
        return "Error: user not found"


class GetUserDetails:
    """``get_user_details``: the user's profile as JSON."""

    @staticmethod
    def invoke(data: Database, user_id: str) -> str:
        users = data["users"]
        if user_id in users:
            return json.dumps(users[user_id])
        return "Error: user not found"


class ListAllAirports:
    """``list_all_airports``: a fixed map of IATA code to city."""

    @staticmethod
    def invoke(data: Database) -> str:
        return json.dumps(AIRPORTS)


def _flight_on(flight: Mapping[str, Any], date: Any) -> dict[str, Any]:
    """A search result: the flight's fields without ``dates``, plus that date's entry."""
    result = {key: value for key, value in flight.items() if key != "dates"}
    result.update(flight["dates"][date])
    return result


class SearchDirectFlight:
    """``search_direct_flight``: available flights from ``origin`` to ``destination`` that day."""

    @staticmethod
    def invoke(data: Database, origin: str, destination: str, date: str) -> str:
        results = [
            _flight_on(flight, date)
            for flight in data["flights"].values()
            if flight["origin"] == origin
            and flight["destination"] == destination
            and date in flight["dates"]
            and flight["dates"][date]["status"] == "available"
        ]
        return json.dumps(results)


class SearchOnestopFlight:
    """``search_onestop_flight``: pairs of available flights connecting through one airport."""

    @staticmethod
    def invoke(data: Database, origin: str, destination: str, date: str) -> str:
        flights = data["flights"]
        results = []
        for first in flights.values():
            if first["origin"] != origin:
                continue
            for second in flights.values():
                if second["destination"] != destination or first["destination"] != second["origin"]:
                    continue
                overnight = "+1" in first["scheduled_arrival_time_est"]
                # Source quirk: no zero padding and always May.
                second_date = f"2024-05-{int(date[-2:]) + 1}" if overnight else date
                if first["scheduled_arrival_time_est"] > second["scheduled_departure_time_est"]:
                    continue
                if not (date in first["dates"] and second_date in second["dates"]):
                    continue
                if (
                    first["dates"][date]["status"] != "available"
                    or second["dates"][second_date]["status"] != "available"
                ):
                    continue
                leg1 = _flight_on(first, date)
                leg1["date"] = date
                leg2 = _flight_on(second, date)  # source quirk: the first leg's date
                leg2["date"] = second_date
                results.append([leg1, leg2])
        return json.dumps(results)


class SendCertificate:
    """``send_certificate``: add the first free certificate id to the user's payment methods."""

    @staticmethod
    def invoke(data: Database, user_id: str, amount: int) -> str | None:
        users = data["users"]
        if user_id not in users:
            return "Error: user not found"
        for number in CERTIFICATE_NUMBERS:
            payment_id = f"certificate_{number}"
            if payment_id not in users[user_id]["payment_methods"]:
                users.mutable(user_id)["payment_methods"][payment_id] = {
                    "source": "certificate",
                    "amount": amount,
                    "id": payment_id,
                }
                return f"Certificate {payment_id} added to user {user_id} with amount {amount}."
        return None  # the source falls off its loop when all three ids are taken


class UpdateReservationBaggages:
    """``update_reservation_baggages``: set bag counts, charging 50 per extra non-free bag."""

    @staticmethod
    def invoke(
        data: Database,
        reservation_id: str,
        total_baggages: int,
        nonfree_baggages: int,
        payment_id: str,
    ) -> str:
        users, reservations = data["users"], data["reservations"]
        if reservation_id not in reservations:
            return "Error: reservation not found"
        reservation = reservations[reservation_id]
        total_price = NONFREE_BAG_PRICE * max(0, nonfree_baggages - reservation["nonfree_baggages"])
        user_id = reservation["user_id"]
        error = _update_payment_error(users[user_id]["payment_methods"], payment_id, total_price)
        if error is not None:
            return error

        reservation = reservations.mutable(reservation_id)
        reservation["total_baggages"] = total_baggages
        reservation["nonfree_baggages"] = nonfree_baggages
        _charge_gift_card(data, user_id, payment_id, total_price)
        _record_payment(reservation, payment_id, total_price)
        return json.dumps(reservation)


class UpdateReservationFlights:
    """``update_reservation_flights``: replace the flights (and cabin price), settling the fare."""

    @staticmethod
    def invoke(
        data: Database,
        reservation_id: str,
        cabin: str,
        flights: list[dict[str, Any]],
        payment_id: str,
    ) -> str:
        users, reservations = data["users"], data["reservations"]
        if reservation_id not in reservations:
            return "Error: reservation not found"
        reservation = reservations[reservation_id]
        passengers = reservation["passengers"]

        total_price = 0
        new_flights = copy.deepcopy(flights)
        for flight in new_flights:
            unchanged = _unchanged_flights(reservation, flight, cabin)
            if unchanged:
                kept = unchanged[0]
                total_price += kept["price"] * len(passengers)
                flight["price"] = kept["price"]
                flight["origin"] = kept["origin"]
                flight["destination"] = kept["destination"]
                continue
            error = _price_new_flight(data, flight, cabin, passengers)
            if error is not None:
                return error
            total_price += flight["price"] * len(passengers)
        total_price -= sum(old["price"] for old in reservation["flights"]) * len(passengers)

        user_id = reservation["user_id"]
        error = _update_payment_error(users[user_id]["payment_methods"], payment_id, total_price)
        if error is not None:
            return error

        _charge_gift_card(data, user_id, payment_id, total_price)
        reservation = reservations.mutable(reservation_id)
        reservation["flights"] = new_flights
        _record_payment(reservation, payment_id, total_price)
        # As in the source, seat counts in the flights table are not updated.
        return json.dumps(reservation)


class UpdateReservationPassengers:
    """``update_reservation_passengers``: replace the passengers, keeping their number."""

    @staticmethod
    def invoke(data: Database, reservation_id: str, passengers: list[dict[str, Any]]) -> str:
        reservations = data["reservations"]
        if reservation_id not in reservations:
            return "Error: reservation not found"
        if len(passengers) != len(reservations[reservation_id]["passengers"]):
            return "Error: number of passengers does not match"
        reservation = reservations.mutable(reservation_id)
        reservation["passengers"] = copy.deepcopy(passengers)
        return json.dumps(reservation)


SPEC = register(
    DomainSpec(
        name="airline",
        tools=(
            BookReservation,
            Calculate,
            CancelReservation,
            GetReservationDetails,
            GetUserDetails,
            ListAllAirports,
            SearchDirectFlight,
            SearchOnestopFlight,
            SendCertificate,
            Think,
            TransferToHumanAgents,
            UpdateReservationBaggages,
            UpdateReservationFlights,
            UpdateReservationPassengers,
        ),
        terminate_tools=("transfer_to_human_agents",),
        write_tools=frozenset(
            {
                "book_reservation",
                "cancel_reservation",
                "send_certificate",
                "update_reservation_baggages",
                "update_reservation_flights",
                "update_reservation_passengers",
            }
        ),
    )
)
