"""Embedded raw material for the procedural retail generator (:mod:`cast_rl.envs.generate`).

Everything here is written for this project: a small product catalogue (product types, their
option dimensions and a price range), name and place lists, our own short retail policy and
OpenAI-style schemas for the 16 retail tools with our own descriptions.  Tool names, parameter
names, types, enums and required lists are those of the tau-bench retail tools, so an agent
trained on generated data calls the benchmark's tools correctly.  Nothing is read from disk.
"""

from __future__ import annotations

from typing import Any

PRODUCTS: tuple[tuple[str, float, float, dict[str, tuple[str, ...]]], ...] = (
    # (name, lowest price, highest price, option name -> values)
    ("T-Shirt", 18.0, 35.0,
     {"color": ("black", "white", "blue", "red"), "size": ("S", "M", "L", "XL")}),
    ("Running Shoes", 70.0, 160.0,
     {"size": ("8", "9", "10", "11"), "color": ("black", "grey", "yellow")}),
    ("Backpack", 40.0, 120.0,
     {"color": ("black", "green", "navy"), "size": ("small", "large"),
      "material": ("nylon", "canvas")}),
    ("Water Bottle", 12.0, 40.0,
     {"capacity": ("500ml", "750ml", "1000ml"), "material": ("steel", "plastic", "glass")}),
    ("Desk Lamp", 25.0, 90.0,
     {"color": ("black", "white", "silver"), "power source": ("USB", "AC", "battery")}),
    ("Headphones", 60.0, 300.0,
     {"type": ("over-ear", "on-ear", "in-ear"), "color": ("black", "white", "blue"),
      "wireless": ("yes", "no")}),
    ("Coffee Maker", 45.0, 220.0,
     {"capacity": ("4 cups", "8 cups", "12 cups"), "type": ("drip", "espresso")}),
    ("Yoga Mat", 20.0, 70.0,
     {"thickness": ("4mm", "6mm", "8mm"), "color": ("purple", "green", "grey")}),
    ("Smart Watch", 150.0, 450.0,
     {"color": ("black", "silver", "gold"), "band": ("leather", "silicone", "metal")}),
    ("Office Chair", 120.0, 480.0,
     {"material": ("mesh", "leather", "fabric"), "color": ("black", "grey"),
      "armrest": ("fixed", "adjustable")}),
    ("Electric Kettle", 25.0, 110.0,
     {"capacity": ("1L", "1.5L", "2L"), "material": ("steel", "glass", "plastic")}),
    ("Sunglasses", 40.0, 200.0,
     {"frame color": ("black", "brown", "silver"), "lens": ("polarized", "standard")}),
    ("Tablet", 200.0, 900.0,
     {"screen": ("8-inch", "10-inch", "12-inch"), "storage": ("64GB", "128GB", "256GB"),
      "color": ("black", "silver")}),
    ("Bluetooth Speaker", 35.0, 250.0,
     {"color": ("black", "blue", "red"), "waterproof": ("yes", "no")}),
    ("Hiking Boots", 80.0, 240.0,
     {"size": ("8", "9", "10", "11"), "material": ("leather", "synthetic"),
      "waterproof": ("yes", "no")}),
    ("Mechanical Keyboard", 60.0, 220.0,
     {"switch": ("linear", "tactile", "clicky"), "layout": ("full size", "compact"),
      "backlight": ("RGB", "white", "none")}),
    ("Wall Clock", 20.0, 90.0,
     {"diameter": ("10 inches", "14 inches"), "color": ("black", "white", "wood")}),
    ("Air Purifier", 90.0, 400.0,
     {"room size": ("small", "medium", "large"), "filter": ("HEPA", "carbon")}),
    ("Notebook", 5.0, 30.0,
     {"size": ("A5", "A4"), "cover": ("hard", "soft"), "paper": ("lined", "dotted", "plain")}),
    ("Fleece Jacket", 45.0, 140.0,
     {"size": ("S", "M", "L", "XL"), "color": ("black", "navy", "red")}),
)

FIRST_NAMES: tuple[str, ...] = (
    "Amara", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas",
    "Kira", "Leo", "Maya", "Nikhil", "Olga", "Pablo", "Quinn", "Rosa", "Sami", "Tara",
    "Umar", "Vera", "Wes", "Xin", "Yusra", "Zane",
)

LAST_NAMES: tuple[str, ...] = (
    "Abbott", "Baker", "Castro", "Dubois", "Eriksen", "Fischer", "Gupta", "Haddad", "Ibrahim",
    "Jensen", "Kowalski", "Larsen", "Moreau", "Novak", "Okafor", "Park", "Quintero", "Reyes",
    "Suzuki", "Tanaka", "Usman", "Varga", "Walsh", "Yilmaz", "Zhou",
)

CITIES: tuple[tuple[str, str, str], ...] = (
    # (city, state, first three digits of the zip code)
    ("Boston", "MA", "021"), ("Atlanta", "GA", "303"), ("Miami", "FL", "331"),
    ("Nashville", "TN", "372"), ("Detroit", "MI", "482"), ("Minneapolis", "MN", "554"),
    ("Kansas City", "MO", "641"), ("Omaha", "NE", "681"), ("Tulsa", "OK", "741"),
    ("Albuquerque", "NM", "871"), ("Portland", "OR", "972"), ("Sacramento", "CA", "958"),
    ("Salt Lake City", "UT", "841"), ("Baltimore", "MD", "212"), ("Raleigh", "NC", "276"),
)

STREETS: tuple[str, ...] = (
    "Maple Avenue", "Oak Street", "Pine Lane", "Elm Road", "Lakeview Drive", "Hillcrest Way",
    "Willow Court", "River Street", "Sunset Boulevard", "Park Place", "Cedar Drive",
    "Highland Avenue", "Meadow Lane", "Chestnut Street", "Harbor Road",
)

CARD_BRANDS: tuple[str, ...] = ("visa", "mastercard", "amex")

POLICY = """\
# Retail agent policy

You help one customer per conversation: cancel or modify pending orders, return or exchange
delivered orders, change the default address, and answer questions about the customer's own
profile, orders and our products.

## Rules
- First authenticate the customer: find their user id by email, or by first name, last name and
  zip code. Do this even if they tell you their user id.
- Serve only the authenticated customer; refuse requests about anyone else.
- Before any action that changes the database (cancel, modify, return, exchange, address change),
  state the exact details and wait for an explicit "yes".
- Use only facts from the customer or from tools. Make one tool call at a time, and do not
  message the customer in the same turn as a tool call.
- Transfer to a human agent only when the request is outside what your tools can do.

## Store facts
- A customer has a profile (email, default address, payment methods: credit card, PayPal or gift
  card with a balance) and orders. Products have variants; each variant is an item with its own
  item id. Product ids and item ids are different things.
- Order statuses: pending, processed, delivered, cancelled. Only pending and delivered orders
  can be acted on. Check the status with get_order_details first.

## Pending orders
- Cancel: the customer confirms the order id and a reason, either "no longer needed" or
  "ordered by mistake". Refunds go to the original payment method (gift cards at once).
- Change the shipping address or the payment method. A new payment method must differ from the
  current one; a gift card must cover the whole order total.
- Change items: each item may become another available variant of the same product. Collect
  every item first: this can be done only once per order, and then the order can no longer be
  cancelled or modified. A payment method pays or receives the price difference; a gift card
  must cover it.

## Delivered orders
- Return: the customer confirms the order id, the items and where the refund goes: the original
  payment method or an existing gift card. The status becomes "return requested".
- Exchange: each item may become another available variant of the same product; collect every
  item first (once per order). A payment method settles the price difference; a gift card must
  cover it. The status becomes "exchange requested".
"""

_ORDER_ID = {"type": "string", "description": "Order id with its leading '#', e.g. '#W1234567'."}
_ITEM_IDS = {
    "type": "array",
    "items": {"type": "string"},
    "description": "Item ids (10 digits) in the order; repeat an id to act on duplicates.",
}
_NEW_ITEM_IDS = {
    "type": "array",
    "items": {"type": "string"},
    "description": "Replacement item ids of the same products, in the same positions as item_ids.",
}
_PAYMENT_ID = {
    "type": "string",
    "description": "Payment method id from the user's profile, e.g. 'paypal_1234567'.",
}
_USER_ID = {"type": "string", "description": "User id, e.g. 'jane_doe_1234'."}
_ADDRESS = {
    "address1": {"type": "string", "description": "Street line, e.g. '12 Oak Street'."},
    "address2": {"type": "string", "description": "Second line, e.g. 'Apt 3', or ''."},
    "city": {"type": "string", "description": "City."},
    "state": {"type": "string", "description": "State code, e.g. 'MA'."},
    "country": {"type": "string", "description": "Country, e.g. 'USA'."},
    "zip": {"type": "string", "description": "Zip code, e.g. '02134'."},
}


def _tool(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(properties),
            },
        },
    }


def tool_schemas() -> list[dict[str, Any]]:
    """Schemas of the 16 retail tools in the benchmark's order (a fresh list on every call)."""
    reason = {
        "type": "string",
        "enum": ["no longer needed", "ordered by mistake"],
        "description": "Why the order is cancelled.",
    }
    return [
        _tool("calculate", "Evaluate an arithmetic expression (numbers, + - * / and parentheses).",
              {"expression": {"type": "string", "description": "E.g. '19.99 * 2 - 5'."}}),
        _tool("cancel_pending_order",
              "Cancel a pending order and refund it. Needs the customer's explicit yes first.",
              {"order_id": _ORDER_ID, "reason": reason}),
        _tool("exchange_delivered_order_items",
              "Request an exchange of items of a delivered order for other variants of the same "
              "products (once per order). Needs the customer's explicit yes first.",
              {"order_id": _ORDER_ID, "item_ids": _ITEM_IDS, "new_item_ids": _NEW_ITEM_IDS,
               "payment_method_id": _PAYMENT_ID}),
        _tool("find_user_id_by_email", "Look up a user id by email address.",
              {"email": {"type": "string", "description": "E.g. 'jane.doe12@example.com'."}}),
        _tool("find_user_id_by_name_zip",
              "Look up a user id by first name, last name and zip code (when email is unknown).",
              {"first_name": {"type": "string", "description": "First name, e.g. 'Jane'."},
               "last_name": {"type": "string", "description": "Last name, e.g. 'Doe'."},
               "zip": {"type": "string", "description": "Zip code, e.g. '02134'."}}),
        _tool("get_order_details", "Show an order: status, items, address, payments.",
              {"order_id": _ORDER_ID}),
        _tool("get_product_details", "Show a product and all its variants (item ids, options, "
              "price, availability).",
              {"product_id": {"type": "string",
                              "description": "Product id (not an item id), 10 digits."}}),
        _tool("get_user_details", "Show a user's profile, payment methods and order ids.",
              {"user_id": _USER_ID}),
        _tool("list_all_product_types", "List every product name with its product id.", {}),
        _tool("modify_pending_order_address",
              "Change the shipping address of a pending order. Needs the customer's explicit yes "
              "first.",
              {"order_id": _ORDER_ID, **_ADDRESS}),
        _tool("modify_pending_order_items",
              "Change items of a pending order to other variants of the same products (once per "
              "order). Needs the customer's explicit yes first.",
              {"order_id": _ORDER_ID, "item_ids": _ITEM_IDS, "new_item_ids": _NEW_ITEM_IDS,
               "payment_method_id": _PAYMENT_ID}),
        _tool("modify_pending_order_payment",
              "Pay a pending order with a different payment method. Needs the customer's explicit "
              "yes first.",
              {"order_id": _ORDER_ID, "payment_method_id": _PAYMENT_ID}),
        _tool("modify_user_address",
              "Change a user's default address. Needs the customer's explicit yes first.",
              {"user_id": _USER_ID, **_ADDRESS}),
        _tool("return_delivered_order_items",
              "Request a return of items of a delivered order; the refund goes to the original "
              "payment method or a gift card. Needs the customer's explicit yes first.",
              {"order_id": _ORDER_ID, "item_ids": _ITEM_IDS, "payment_method_id": _PAYMENT_ID}),
        _tool("think", "Write down a thought; changes nothing.",
              {"thought": {"type": "string", "description": "The thought."}}),
        _tool("transfer_to_human_agents",
              "Hand the conversation to a human agent, with a summary. Only for requests your "
              "tools cannot handle, or when the customer asks for a human.",
              {"summary": {"type": "string", "description": "Summary of the customer's issue."}}),
    ]
