"""The web shop's scripted tasks: gold plans of browser actions, drawn from a seed, and each
task's goal state (its gold plan applied once to a fresh shop, with no faults and no mode).

Six kinds of task, in turn: buy products, edit a cart and buy, change the address and buy,
change account settings, post reviews, book a pick-up slot and buy. The bank is a pure
function of (size, seed): every mode, cell and trial that names a task gets the same plan.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from harness.agents.task import Step, Task
from harness.workloads.scripted import ScriptedTask, draw_bank, replay_goal
from harness.workloads.webshop import shop
from harness.workloads.webshop.tools import TOOLS

KINDS: tuple[str, ...] = ("buy", "cart_edit", "address_buy", "account", "review", "pickup_buy")
_BUYERS = ("alice", "carol", "erin")
_STREETS = ("12 Oak Ave", "7 Harbour Rd", "41 Mill Lane", "3 Station Sq", "88 Elm Close")
_CITIES = ("Lakeside", "Riverton", "Hillford", "Northgate")
_REVIEWS = ("Does the job.", "Great value, would buy again.", "Smaller than expected.", "Excellent quality.")


def _page(user: str, page: str, sku: str | None = None) -> Step:
    return Step("open_page", {"user": user, "page": page, **({"sku": sku} if sku else {})})


def _buy(rng: random.Random) -> tuple[str, list[Step]]:
    user = rng.choice(_BUYERS)
    steps = [_page(user, "catalog")]
    skus = rng.sample(shop.SKUS, rng.randint(1, 2))
    for sku in skus:
        steps.append(_page(user, "product", sku))
        steps += [Step("add_to_cart", {"user": user, "sku": sku})] * rng.randint(1, 2)
    steps.append(_page(user, "cart"))
    if rng.random() < 0.5:
        steps.append(Step("apply_coupon", {"user": user, "code": rng.choice(sorted(shop.COUPONS))}))
    steps.append(Step("place_order", {"user": user}))
    return f"{user} buys {', '.join(skus)}", steps


def _cart_edit(rng: random.Random) -> tuple[str, list[Step]]:
    user = rng.choice(sorted(shop.INITIAL_CARTS))
    lines = shop.INITIAL_CARTS[user]
    keep, drop = rng.sample(sorted(lines), 2)
    qty = rng.choice([q for q in (1, 2, 3) if q != lines[keep]])
    steps = [
        _page(user, "cart"),
        Step("set_quantity", {"user": user, "sku": keep, "qty": qty}),
        Step("set_quantity", {"user": user, "sku": drop, "qty": 0}),
    ]
    if rng.random() < 0.5:
        extra = rng.choice([s for s in shop.SKUS if s not in lines])
        steps += [_page(user, "product", extra), Step("add_to_cart", {"user": user, "sku": extra})]
    steps += [Step("apply_coupon", {"user": user, "code": rng.choice(sorted(shop.COUPONS))}),
              _page(user, "cart"), Step("place_order", {"user": user})]
    return f"{user} sets {keep} to {qty}, drops {drop} and buys", steps


def _address_steps(rng: random.Random, user: str) -> list[Step]:
    values = {"street": rng.choice(_STREETS), "city": rng.choice(_CITIES), "zip": f"2{rng.randrange(10**4):04d}"}
    fields = rng.sample(shop.ADDRESS_FIELDS, rng.randint(2, 3))
    return [_page(user, "account"),
            *(Step("fill_field", {"user": user, "field": f, "value": values[f]}) for f in fields),
            Step("save_address", {"user": user})]


def _address_buy(rng: random.Random) -> tuple[str, list[Step]]:
    user = rng.choice(_BUYERS)
    sku = rng.choice(shop.SKUS)
    steps = [*_address_steps(rng, user), _page(user, "product", sku),
             Step("add_to_cart", {"user": user, "sku": sku}), _page(user, "cart"),
             Step("place_order", {"user": user})]
    return f"{user} changes the address and buys {sku}", steps


def _account(rng: random.Random) -> tuple[str, list[Step]]:
    user = rng.choice(shop.USERS)
    steps = [*_address_steps(rng, user), Step("toggle_newsletter", {"user": user})]
    return f"{user} changes the address and the newsletter", steps


def _review(rng: random.Random) -> tuple[str, list[Step]]:
    user = rng.choice(shop.USERS)
    steps = [_page(user, "orders")]
    skus = rng.sample(shop.SKUS, rng.randint(1, 2))
    for sku in skus:
        steps += [_page(user, "product", sku),
                  Step("post_review", {"user": user, "sku": sku, "stars": rng.randint(1, 5),
                                       "text": rng.choice(_REVIEWS)})]
    return f"{user} reviews {', '.join(skus)}", steps


def _pickup_buy(rng: random.Random) -> tuple[str, list[Step]]:
    user = rng.choice(_BUYERS)
    free = [s for s in shop.SLOTS
            if user not in shop.INITIAL_BOOKINGS.get(s, []) and len(shop.INITIAL_BOOKINGS.get(s, [])) < shop.SLOT_CAPACITY]
    slot = rng.choice(free)
    sku = rng.choice(shop.SKUS)
    steps = [_page(user, "pickup"), Step("book_pickup", {"user": user, "slot": slot}),
             _page(user, "product", sku), Step("add_to_cart", {"user": user, "sku": sku}),
             Step("place_order", {"user": user})]
    return f"{user} books {slot} and buys {sku}", steps


_MAKERS: dict[str, Callable[[random.Random], tuple[str, list[Step]]]] = {
    "buy": _buy, "cart_edit": _cart_edit, "address_buy": _address_buy,
    "account": _account, "review": _review, "pickup_buy": _pickup_buy,
}


def task_bank(size: int, seed: int) -> list[ScriptedTask]:
    """`size` tasks, the kinds in turn; a pure function of (size, seed)."""
    return draw_bank(_MAKERS, KINDS, size, seed, name="webshop", prefix="shop")


def goal_state(task: Task) -> dict[str, Any]:
    """The shop after the task's gold plan ran once, directly: where a clean trial ends."""
    return replay_goal(task, shop.setup, TOOLS)
