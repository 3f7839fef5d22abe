"""The web shop's browser actions as tools, with the settlement metadata every mode reads.

Classes follow paper Table 4's WebArena adapter: page reads are read-only (their page is a
read scope); cart, form, review and account actions write rows of the shop's own database,
so an adapter can hold them until commit (bufferable); a pick-up booking is a reservation
with a cancel (reversible); placing an order takes payment and mails a confirmation that
can never be unsent (irreversible: gated). Every revocable action has a before-image of the
rows it writes and an undo that restores them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from atomix.effects import EffectClass
from harness.workloads.webshop import shop
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery, ToolDef

B, R, IRR = EffectClass.BUFFERABLE, EffectClass.REVERSIBLE, EffectClass.IRREVERSIBLE
Args = dict[str, Any]
RowsOf = Callable[[TrialEnv, Args], "shop.Rows"]


def _no_scopes(env: TrialEnv, a: Args) -> list[str]:
    return []


def _revocable(
    name: str,
    effect: EffectClass,
    reads: Callable[[TrialEnv, Args], list[str]],
    writes: Callable[[TrialEnv, Args], list[str]],
    run: Callable[[TrialEnv, Args, Delivery], Any],
    rows: RowsOf,
    **extra: Any,
) -> ToolDef:
    """A tool whose undo restores the before-image of the rows it writes."""
    return ToolDef(
        name, effect, reads, writes, run,
        before=lambda env, a: shop.rows_before(env, rows(env, a)),
        undo=lambda env, a, before, d: shop.restore_rows(env, before, d),
        **extra,
    )


def _other(options: list[Any], current: Any, rng: random.Random) -> Any | None:
    rest = [o for o in options if o != current]
    return rest[rng.randrange(len(rest))] if rest else None


def _swap(args: Args, name: str, value: Any | None) -> Args | None:
    return None if value is None else {**args, name: value}


def _typo(text: str, rng: random.Random) -> str | None:
    """The text with two neighbouring characters swapped (a plausible mistyped value)."""
    pairs = [i for i in range(len(text) - 1) if text[i] != text[i + 1]]
    if not pairs:
        return None
    i = pairs[rng.randrange(len(pairs))]
    return text[:i] + text[i + 1] + text[i] + text[i + 2 :]


# -- scopes of each action ------------------------------------------------------------------------
def _qty_scope(env: TrialEnv, a: Args) -> list[str]:
    return [shop.scope("cart", a["user"], f"qty-{a['sku']}")]


def _cart_row(env: TrialEnv, a: Args) -> shop.Rows:
    return [("carts", f"{a['user']}:{a['sku']}")]


def _review_rows(env: TrialEnv, a: Args) -> shop.Rows:
    n = (env.db.get("review_counts", a["sku"]) or 0) + 1
    return [("reviews", f"{a['sku']}:{n}"), ("review_counts", a["sku"])]


def _address_rows(env: TrialEnv, a: Args) -> shop.Rows:
    return [("profiles", a["user"])] + [("forms", shop.draft_row(a["user"], f)) for f in shop.ADDRESS_FIELDS]


def _order_reads(env: TrialEnv, a: Args) -> list[str]:
    return [shop.scope("cart", a["user"]), shop.scope("account", a["user"])]


def _order_writes(env: TrialEnv, a: Args) -> list[str]:
    # Stock of any product in the cart: the catalogue, which covers every product page.
    return [shop.scope("cart", a["user"]), shop.scope("orders", a["user"]), shop.scope("product"),
            env.mailbox.scope(shop.email(a["user"]))]


def _check_quantity(env: TrialEnv, a: Args) -> None:
    stock = env.db.get("products", shop.product(a["sku"]).sku)["stock"]
    if a["qty"] > stock:
        raise shop.ToolError(f"409: only {stock} of {a['sku']} in stock")


TOOLS: dict[str, ToolDef] = {
    t.name: t
    for t in (
        ToolDef(
            "open_page", None,
            lambda env, a: [shop.page_scope(a["page"], a["user"], a.get("sku"))], _no_scopes,
            lambda env, a, d: shop.page(env, a["page"], a["user"], a.get("sku"), d.meta),
        ),
        _revocable(
            "add_to_cart", B, lambda env, a: [shop.page_scope("product", a["user"], a["sku"])], _qty_scope,
            lambda env, a, d: shop.add_to_cart(env, a["user"], a["sku"], d), _cart_row,
            check=lambda env, a: shop.check_stock(env, a["user"], a["sku"], 1),
            alternatives=lambda env, a, rng: _swap(a, "sku", _other(list(shop.SKUS), a["sku"], rng)),
        ),
        _revocable(
            "set_quantity", B, _no_scopes, _qty_scope,
            lambda env, a, d: shop.set_quantity(env, a["user"], a["sku"], a["qty"], d), _cart_row,
            idempotent=True, check=_check_quantity,
            alternatives=lambda env, a, rng: _swap(a, "qty", _other([a["qty"] - 1, a["qty"] + 1], None, rng)
                                                   if a["qty"] > 0 else a["qty"] + 1),
        ),
        _revocable(
            "apply_coupon", B, _no_scopes, lambda env, a: [shop.scope("cart", a["user"], "coupon")],
            lambda env, a, d: shop.apply_coupon(env, a["user"], a["code"], d),
            lambda env, a: [("cart_coupons", a["user"])],
            idempotent=True, check=lambda env, a: shop.check_coupon(env, a["code"]),
            alternatives=lambda env, a, rng: _swap(a, "code", _other(sorted(shop.COUPONS), a["code"], rng)),
        ),
        _revocable(
            "fill_field", B, _no_scopes,
            lambda env, a: [shop.scope("account", a["user"], f"addr-{a['field']}")],
            lambda env, a, d: shop.fill_field(env, a["user"], a["field"], a["value"], d),
            lambda env, a: [("forms", shop.draft_row(a["user"], a["field"]))],
            idempotent=True,
            alternatives=lambda env, a, rng: _swap(a, "value", _typo(a["value"], rng)),
        ),
        _revocable(
            # A page-level write: saving the form changes everything the account page shows.
            "save_address", B, _no_scopes, lambda env, a: [shop.scope("account", a["user"])],
            lambda env, a, d: shop.save_address(env, a["user"], d), _address_rows,
            idempotent=True,
        ),
        _revocable(
            "toggle_newsletter", B, _no_scopes, lambda env, a: [shop.scope("account", a["user"], "newsletter")],
            lambda env, a, d: shop.toggle_newsletter(env, a["user"], d),
            lambda env, a: [("profiles", a["user"])],
        ),
        _revocable(
            "post_review", B, _no_scopes, lambda env, a: [shop.scope("product", a["sku"], "reviews")],
            lambda env, a, d: shop.post_review(env, a["user"], a["sku"], a["stars"], a["text"], d),
            _review_rows,
            alternatives=lambda env, a, rng: _swap(a, "stars", _other([a["stars"] - 1, a["stars"] + 1], None, rng)
                                                   if 1 < a["stars"] < 5 else (4 if a["stars"] == 5 else 2)),
        ),
        _revocable(
            "book_pickup", R, _no_scopes, lambda env, a: [shop.scope("pickup", a["slot"])],
            lambda env, a, d: shop.book_pickup(env, a["user"], a["slot"], d),
            lambda env, a: [("pickups", a["slot"])],
            check=lambda env, a: shop.check_slot(env, a["user"], a["slot"]),
            alternatives=lambda env, a, rng: _swap(a, "slot", _other(list(shop.SLOTS), a["slot"], rng)),
        ),
        ToolDef(
            "place_order", IRR, _order_reads, _order_writes,
            lambda env, a, d: shop.place_order(env, a["user"], d),
        ),
    )
}
