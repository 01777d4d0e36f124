"""The tau-bench retail domain: 16 tools over orders, products and users.

Each tool reproduces ``tau_bench/envs/retail/tools/<name>.py``: same keyword arguments, the same
checks in the same order, the same observation strings and the same exceptions for bad input
(a tool fed a non-list ``item_ids`` fails, or not, exactly where the source's code does).  Where
the source mutates records in place we first take this fork's copy (``Table.mutable``), and we
mutate in the source's order, so a call that raises half-way leaves the same partial change.
The only stored caller objects are copied, so no later caller-side change can leak into a fork.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from cast_rl.envs.domain import DomainSpec, register
from cast_rl.envs.domains.common import Calculate, Think, TransferToHumanAgents

_CANCEL_REASONS = ["no longer needed", "ordered by mistake"]


def _own(value: Any) -> Any:
    """A value safe to store in a record this fork owns (containers are copied)."""
    return copy.deepcopy(value) if isinstance(value, (dict, list)) else value


def _address(
    address1: Any, address2: Any, city: Any, state: Any, country: Any, zip: Any
) -> dict[str, Any]:
    return {
        "address1": _own(address1),
        "address2": _own(address2),
        "city": _own(city),
        "state": _own(state),
        "country": _own(country),
        "zip": _own(zip),
    }


def _missing_item(order: dict[str, Any], item_ids: Any) -> tuple[bool, Any]:
    """``(True, id)`` for the first id asked for more often than the order holds it."""
    all_item_ids = [item["item_id"] for item in order["items"]]
    for item_id in item_ids:
        if item_ids.count(item_id) > all_item_ids.count(item_id):
            return True, item_id
    return False, None


def _first_item(order: dict[str, Any], item_id: Any) -> dict[str, Any]:
    return [item for item in order["items"] if item["item_id"] == item_id][0]


def _price_difference(
    products: Any, order: dict[str, Any], item_ids: Any, new_item_ids: Any
) -> tuple[Any, str | None]:
    """Sum of new minus old prices, or the source's error for an unavailable new item."""
    diff_price: Any = 0
    for item_id, new_item_id in zip(item_ids, new_item_ids):
        item = _first_item(order, item_id)
        variants = products[item["product_id"]]["variants"]
        if not (new_item_id in variants and variants[new_item_id]["available"]):
            return diff_price, f"Error: new item {new_item_id} not found or available"
        diff_price += variants[new_item_id]["price"] - item["price"]
    return diff_price, None


class CancelPendingOrder:
    @staticmethod
    def invoke(data: Any, order_id: str, reason: str) -> str:
        orders = data["orders"]
        if order_id not in orders:
            return "Error: order not found"
        order = orders[order_id]
        if order["status"] != "pending":
            return "Error: non-pending order cannot be cancelled"
        if reason not in _CANCEL_REASONS:
            return "Error: invalid reason"
        refunds = []
        for payment in order["payment_history"]:
            payment_id = payment["payment_method_id"]
            refunds.append(
                {
                    "transaction_type": "refund",
                    "amount": payment["amount"],
                    "payment_method_id": payment_id,
                }
            )
            if "gift_card" in payment_id:  # gift cards are refunded at once
                user = data["users"].mutable(order["user_id"])
                method = user["payment_methods"][payment_id]
                method["balance"] += payment["amount"]
                method["balance"] = round(method["balance"], 2)
        order = orders.mutable(order_id)
        order["status"] = "cancelled"
        order["cancel_reason"] = reason
        order["payment_history"].extend(refunds)
        return json.dumps(order)


class ExchangeDeliveredOrderItems:
    @staticmethod
    def invoke(
        data: Any,
        order_id: str,
        item_ids: list[str],
        new_item_ids: list[str],
        payment_method_id: str,
    ) -> str:
        products, orders, users = data["products"], data["orders"], data["users"]
        if order_id not in orders:
            return "Error: order not found"
        order = orders[order_id]
        if order["status"] != "delivered":
            return "Error: non-delivered order cannot be exchanged"
        missing, item_id = _missing_item(order, item_ids)
        if missing:
            return f"Error: {item_id} not found"
        if len(item_ids) != len(new_item_ids):
            return "Error: the number of items to be exchanged should match"
        diff_price, error = _price_difference(products, order, item_ids, new_item_ids)
        if error is not None:
            return error
        diff_price = round(diff_price, 2)
        if payment_method_id not in users[order["user_id"]]["payment_methods"]:
            return "Error: payment method not found"
        method = users[order["user_id"]]["payment_methods"][payment_method_id]
        if method["source"] == "gift_card" and method["balance"] < diff_price:
            return "Error: insufficient gift card balance to pay for the price difference"
        order = orders.mutable(order_id)
        order["status"] = "exchange requested"
        order["exchange_items"] = sorted(item_ids)
        order["exchange_new_items"] = sorted(new_item_ids)
        order["exchange_payment_method_id"] = _own(payment_method_id)
        order["exchange_price_difference"] = diff_price
        return json.dumps(order)


class FindUserIdByEmail:
    @staticmethod
    def invoke(data: Any, email: str) -> str:
        for user_id, profile in data["users"].items():
            if profile["email"].lower() == email.lower():
                return user_id
        return "Error: user not found"


class FindUserIdByNameZip:
    @staticmethod
    def invoke(data: Any, first_name: str, last_name: str, zip: str) -> str:
        for user_id, profile in data["users"].items():
            if (
                profile["name"]["first_name"].lower() == first_name.lower()
                and profile["name"]["last_name"].lower() == last_name.lower()
                and profile["address"]["zip"] == zip
            ):
                return user_id
        return "Error: user not found"


def _record_json(data: Any, table: str, key: str, what: str) -> str:
    """A record as the source's get_*_details tools show it, or their not-found error."""
    records = data[table]
    return json.dumps(records[key]) if key in records else f"Error: {what} not found"


class GetOrderDetails:
    @staticmethod
    def invoke(data: Any, order_id: str) -> str:
        return _record_json(data, "orders", order_id, "order")


class GetProductDetails:
    @staticmethod
    def invoke(data: Any, product_id: str) -> str:
        return _record_json(data, "products", product_id, "product")


class GetUserDetails:
    @staticmethod
    def invoke(data: Any, user_id: str) -> str:
        return _record_json(data, "users", user_id, "user")


class ListAllProductTypes:
    @staticmethod
    def invoke(data: Any) -> str:
        names = {product["name"]: product["product_id"] for product in data["products"].values()}
        return json.dumps(dict(sorted(names.items())))


class ModifyPendingOrderAddress:
    @staticmethod
    def invoke(
        data: Any,
        order_id: str,
        address1: str,
        address2: str,
        city: str,
        state: str,
        country: str,
        zip: str,
    ) -> str:
        orders = data["orders"]
        if order_id not in orders:
            return "Error: order not found"
        if orders[order_id]["status"] != "pending":
            return "Error: non-pending order cannot be modified"
        order = orders.mutable(order_id)
        order["address"] = _address(address1, address2, city, state, country, zip)
        return json.dumps(order)


class ModifyPendingOrderItems:
    @staticmethod
    def invoke(
        data: Any,
        order_id: str,
        item_ids: list[str],
        new_item_ids: list[str],
        payment_method_id: str,
    ) -> str:
        products, orders, users = data["products"], data["orders"], data["users"]
        if order_id not in orders:
            return "Error: order not found"
        order = orders[order_id]
        if order["status"] != "pending":
            return "Error: non-pending order cannot be modified"
        missing, item_id = _missing_item(order, item_ids)
        if missing:
            return f"Error: {item_id} not found"
        if len(item_ids) != len(new_item_ids):
            return "Error: the number of items to be exchanged should match"
        diff_price, error = _price_difference(products, order, item_ids, new_item_ids)
        if error is not None:
            return error
        user_id = order["user_id"]
        if payment_method_id not in users[user_id]["payment_methods"]:
            return "Error: payment method not found"
        method = users[user_id]["payment_methods"][payment_method_id]
        if method["source"] == "gift_card" and method["balance"] < diff_price:
            return "Error: insufficient gift card balance to pay for the new item"
        order = orders.mutable(order_id)
        order["payment_history"].append(
            {
                "transaction_type": "payment" if diff_price > 0 else "refund",
                "amount": abs(diff_price),
                "payment_method_id": _own(payment_method_id),
            }
        )
        if method["source"] == "gift_card":
            method = users.mutable(user_id)["payment_methods"][payment_method_id]
            method["balance"] -= diff_price
            method["balance"] = round(method["balance"], 2)
        for item_id, new_item_id in zip(item_ids, new_item_ids):
            item = _first_item(order, item_id)
            item["item_id"] = new_item_id
            variant = products[item["product_id"]]["variants"][new_item_id]
            item["price"] = variant["price"]
            item["options"] = copy.deepcopy(variant["options"])
        order["status"] = "pending (item modified)"
        return json.dumps(order)


class ModifyPendingOrderPayment:
    @staticmethod
    def invoke(data: Any, order_id: str, payment_method_id: str) -> str:
        orders, users = data["orders"], data["users"]
        if order_id not in orders:
            return "Error: order not found"
        order = orders[order_id]
        if order["status"] != "pending":
            return "Error: non-pending order cannot be modified"
        user_id = order["user_id"]
        if payment_method_id not in users[user_id]["payment_methods"]:
            return "Error: payment method not found"
        history = order["payment_history"]
        if len(history) > 1 or history[0]["transaction_type"] != "payment":
            return "Error: there should be exactly one payment for a pending order"
        if history[0]["payment_method_id"] == payment_method_id:
            return "Error: the new payment method should be different from the current one"
        amount = history[0]["amount"]
        method = users[user_id]["payment_methods"][payment_method_id]
        if method["source"] == "gift_card" and method["balance"] < amount:
            return "Error: insufficient gift card balance to pay for the order"
        order = orders.mutable(order_id)
        old_method_id = order["payment_history"][0]["payment_method_id"]
        order["payment_history"].extend(
            [
                {
                    "transaction_type": "payment",
                    "amount": amount,
                    "payment_method_id": _own(payment_method_id),
                },
                {
                    "transaction_type": "refund",
                    "amount": amount,
                    "payment_method_id": old_method_id,
                },
            ]
        )
        if method["source"] == "gift_card":
            method = users.mutable(user_id)["payment_methods"][payment_method_id]
            method["balance"] -= amount
            method["balance"] = round(method["balance"], 2)
        if "gift_card" in old_method_id:
            old_method = users.mutable(user_id)["payment_methods"][old_method_id]
            old_method["balance"] += amount
            old_method["balance"] = round(old_method["balance"], 2)
        return json.dumps(order)


class ModifyUserAddress:
    @staticmethod
    def invoke(
        data: Any,
        user_id: str,
        address1: str,
        address2: str,
        city: str,
        state: str,
        country: str,
        zip: str,
    ) -> str:
        users = data["users"]
        if user_id not in users:
            return "Error: user not found"
        user = users.mutable(user_id)
        user["address"] = _address(address1, address2, city, state, country, zip)
        return json.dumps(user)


class ReturnDeliveredOrderItems:
    @staticmethod
    def invoke(data: Any, order_id: str, item_ids: list[str], payment_method_id: str) -> str:
        orders = data["orders"]
        if order_id not in orders:
            return "Error: order not found"
        order = orders[order_id]
        if order["status"] != "delivered":
            return "Error: non-delivered order cannot be returned"
        if payment_method_id not in data["users"][order["user_id"]]["payment_methods"]:
            return "Error: payment method not found"
        if (
            "gift_card" not in payment_method_id
            and payment_method_id != order["payment_history"][0]["payment_method_id"]
        ):
            return (
                "Error: payment method should be either the original payment method or a gift card"
            )
        if _missing_item(order, item_ids)[0]:
            return "Error: some item not found"
        order = orders.mutable(order_id)
        order["status"] = "return requested"
        order["return_items"] = sorted(item_ids)
        order["return_payment_method_id"] = _own(payment_method_id)
        return json.dumps(order)


SPEC = register(
    DomainSpec(
        name="retail",
        tools=(
            Calculate,
            CancelPendingOrder,
            ExchangeDeliveredOrderItems,
            FindUserIdByEmail,
            FindUserIdByNameZip,
            GetOrderDetails,
            GetProductDetails,
            GetUserDetails,
            ListAllProductTypes,
            ModifyPendingOrderAddress,
            ModifyPendingOrderItems,
            ModifyPendingOrderPayment,
            ModifyUserAddress,
            ReturnDeliveredOrderItems,
            Think,
            TransferToHumanAgents,
        ),
        terminate_tools=("transfer_to_human_agents",),
        write_tools=frozenset(
            {
                "cancel_pending_order",
                "exchange_delivered_order_items",
                "modify_pending_order_address",
                "modify_pending_order_items",
                "modify_pending_order_payment",
                "modify_user_address",
                "return_delivered_order_items",
            }
        ),
    )
)
