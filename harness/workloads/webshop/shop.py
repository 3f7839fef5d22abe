"""The web shop that the PROXY for paper Table 5's WebArena columns runs on (not WebArena).

An in-process shop served from one trial's real SQLite database (`TrialEnv.db`) and its
real append-only mailbox: a catalogue with stock, per-user carts, coupons, an account page
with an address form, product reviews, pick-up slots, and a checkout that places an order
and mails a confirmation. Pages are read with `page`; every action is a function that
performs one form post or button click on the substrate, with the delivery's idempotency
key (derived per row when one action writes several) and its op-log metadata.

Scopes follow paper Table 4's WebArena adapter (`webarena:site:page` with an optional
element suffix), spelt as plain names of kind `web`: a page `web:shop.local:cart:alice`
covers its elements `web:shop.local:cart:alice:qty-sku3`, so reading a page conflicts with
a write to any element on it, and two different elements never conflict. Session pages
(cart, account, orders) name the signed-in user. (`url:` scopes drop fragments and never
overlap a named kind, so they cannot carry page-and-element levels.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from atomix.scope_kinds import named_scope
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery, ToolError

SITE = "shop.local"
Meta = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Product:
    """One catalogue entry; prices in cents."""

    sku: str
    name: str
    price_cents: int
    stock: int


CATALOGUE: tuple[Product, ...] = (
    Product("sku1", "Blue mug", 1200, 6),
    Product("sku2", "Tea towel", 800, 9),
    Product("sku3", "Chef knife", 4500, 4),
    Product("sku4", "Cutting board", 2500, 5),
    Product("sku5", "Espresso cups (2)", 1800, 7),
    Product("sku6", "Olive oil 1l", 1500, 8),
    Product("sku7", "Pepper mill", 2200, 5),
    Product("sku8", "Salad bowl", 3000, 4),
    Product("sku9", "Apron", 1900, 6),
    Product("sku10", "Bread tin", 1600, 5),
    Product("sku11", "Whisk", 700, 9),
    Product("sku12", "Cast-iron pan", 5200, 3),
)
SKUS: tuple[str, ...] = tuple(p.sku for p in CATALOGUE)
USERS: tuple[str, ...] = ("alice", "bob", "carol", "dave", "erin")
COUPONS: dict[str, int] = {"SAVE10": 10, "WELCOME15": 15, "KITCHEN20": 20}  # code -> percent off
SLOTS: tuple[str, ...] = ("mon-am", "mon-pm", "tue-am", "tue-pm")
SLOT_CAPACITY = 2
ADDRESS_FIELDS: tuple[str, ...] = ("street", "city", "zip")
# Carts some users already hold when the trial starts (for tasks that edit a cart).
INITIAL_CARTS: dict[str, dict[str, int]] = {
    "bob": {"sku2": 2, "sku5": 1},
    "dave": {"sku4": 1, "sku9": 3, "sku11": 1},
}
INITIAL_BOOKINGS: dict[str, list[str]] = {"mon-am": ["carol"], "tue-pm": ["erin"]}


def email(user: str) -> str:
    return f"{user}@example.com"


def product(sku: str) -> Product:
    for p in CATALOGUE:
        if p.sku == sku:
            return p
    raise ToolError(f"404: no product {sku!r}")


def _user(user: str) -> str:
    if user not in USERS:
        raise ToolError(f"403: no signed-in user {user!r}")
    return user


# -- scopes ---------------------------------------------------------------------------------------
def scope(*parts: str) -> str:
    """`web:shop.local:<parts>`: a page, or an element of a page (the page's parts first)."""
    return str(named_scope(":".join(("web", SITE, *parts))))


PAGES: tuple[str, ...] = ("catalog", "product", "cart", "account", "orders", "pickup")


def page_scope(page: str, user: str, sku: str | None = None) -> str:
    """The read scope of a page: what it shows. The catalogue shows every product."""
    if page == "catalog":
        return scope("product")
    if page == "product":
        if sku is None:
            raise ToolError("404: a product page needs a sku")
        return scope("product", product(sku).sku)
    if page == "pickup":
        return scope("pickup")
    if page in ("cart", "account", "orders"):
        return scope(page, _user(user))
    raise ToolError(f"404: no page {page!r}; pages: {', '.join(PAGES)}")


# -- state ----------------------------------------------------------------------------------------
TABLES: tuple[str, ...] = (
    "products", "coupons", "profiles", "carts", "cart_coupons", "forms", "orders", "order_counts",
    "reviews", "review_counts", "pickups",
)


def setup(env: TrialEnv) -> None:
    """The shop when the trial starts, written directly (no agent: the oracle ignores it).

    Every table exists from the start (the shop's schema), so a row written and then undone
    leaves the state as it was, not an extra empty table."""
    for table in TABLES:
        env.db.ensure_table(table)
    rows: list[tuple[str, Any, Any]] = [
        ("products", p.sku, {"name": p.name, "price_cents": p.price_cents, "stock": p.stock})
        for p in CATALOGUE
    ]
    rows += [("coupons", code, {"percent": pct}) for code, pct in COUPONS.items()]
    rows += [("profiles", u, {"street": f"{n + 1} Main St", "city": "Springfield", "zip": f"1000{n}",
                              "newsletter": n % 2 == 0}) for n, u in enumerate(USERS)]
    rows += [("carts", f"{u}:{sku}", qty) for u, lines in INITIAL_CARTS.items() for sku, qty in lines.items()]
    rows += [("pickups", s, {"holders": INITIAL_BOOKINGS.get(s, [])}) for s in SLOTS]
    env.db.put_many(rows)


def _sub(key: str | None, part: str) -> str | None:
    """The key of one row write of a multi-row action: applied at most once per action key."""
    return None if key is None else f"{key}#{part}"


def replayed(env: TrialEnv, key: str | None) -> bool:
    """Whether a delivery with this key was already applied: the shop then answers without
    acting or re-checking, as a server honouring idempotency keys does."""
    return key is not None and key in env.db.applied_keys()


REPLAYED = {"status": "already applied"}


def cart_lines(env: TrialEnv, user: str, *, log_read: bool = False, meta: Meta | None = None) -> dict[str, int]:
    lines = {}
    for sku in SKUS:
        qty = env.db.get("carts", f"{user}:{sku}", log_read=log_read, meta=meta)
        if qty:
            lines[sku] = qty
    return lines


def _coupon(env: TrialEnv, user: str, meta: Meta | None = None, log_read: bool = False) -> str | None:
    row = env.db.get("cart_coupons", user, log_read=log_read, meta=meta)
    return None if row is None else row["code"]


def _total(lines: Mapping[str, int], percent: int) -> int:
    gross = sum(product(sku).price_cents * qty for sku, qty in lines.items())
    return gross - gross * percent // 100


# -- pages (GET) ----------------------------------------------------------------------------------
def page(env: TrialEnv, page_name: str, user: str, sku: str | None, meta: Meta) -> str:
    """The page as text (an accessibility-tree-like listing of its elements)."""
    page_scope(page_name, user, sku)  # refuses an unknown page or user
    db = env.db
    if page_name == "catalog":
        items = [f"{p.sku}: {p.name} {p.price_cents / 100:.2f} "
                 f"(stock {db.get('products', p.sku, log_read=True, meta=meta)['stock']})" for p in CATALOGUE]
        return "catalog | " + "; ".join(items)
    if page_name == "product":
        assert sku is not None
        row = db.get("products", sku, log_read=True, meta=meta)
        reviews = db.get("review_counts", sku, log_read=True, meta=meta) or 0
        return f"product {sku} | {row['name']} {row['price_cents'] / 100:.2f} | stock {row['stock']} | {reviews} reviews | [add-to-cart]"
    if page_name == "cart":
        lines = cart_lines(env, user, log_read=True, meta=meta)
        code = _coupon(env, user, meta, log_read=True)
        total = _total(lines, COUPONS.get(code or "", 0))
        shown = "; ".join(f"qty-{s}={q}" for s, q in lines.items()) or "empty"
        return f"cart of {user} | {shown} | coupon {code or '-'} | total {total / 100:.2f} | [place-order]"
    if page_name == "account":
        prof = db.get("profiles", user, log_read=True, meta=meta)
        typed = draft(env, user, log_read=True, meta=meta)
        fields = "; ".join(f"addr-{f}={typed.get(f, prof[f])}" for f in ADDRESS_FIELDS)
        return f"account of {user} | {fields} | newsletter {'on' if prof['newsletter'] else 'off'} | [save-address]"
    if page_name == "orders":
        count = (db.get("order_counts", user, log_read=True, meta=meta) or 0)
        return f"orders of {user} | {count} orders"
    slots = [f"{s}: {SLOT_CAPACITY - len(db.get('pickups', s, log_read=True, meta=meta)['holders'])} free" for s in SLOTS]
    return "pickup | " + "; ".join(slots)


# -- actions (POST) -------------------------------------------------------------------------------
def add_to_cart(env: TrialEnv, user: str, sku: str, d: Delivery) -> int:
    """The product page's [add-to-cart] button: one more of `sku` in the cart."""
    if replayed(env, d.key):
        return env.db.get("carts", f"{user}:{sku}") or 0
    check_stock(env, user, sku, 1)
    qty = (env.db.get("carts", f"{_user(user)}:{sku}") or 0) + 1
    env.db.put("carts", f"{user}:{sku}", qty, key=d.key, meta=d.meta)
    return qty


def check_stock(env: TrialEnv, user: str, sku: str, more: int) -> None:
    stock = env.db.get("products", product(sku).sku)["stock"]
    in_cart = env.db.get("carts", f"{_user(user)}:{sku}") or 0
    if in_cart + more > stock:
        raise ToolError(f"409: only {stock} of {sku} in stock")


def set_quantity(env: TrialEnv, user: str, sku: str, qty: int, d: Delivery) -> int:
    """The cart's quantity field of one line, submitted; 0 removes the line."""
    product(sku)
    if not isinstance(qty, int) or qty < 0:
        raise ToolError(f"422: quantity must be a whole number >= 0, got {qty!r}")
    if qty == 0:
        env.db.delete("carts", f"{_user(user)}:{sku}", key=d.key, meta=d.meta)
    else:
        env.db.put("carts", f"{_user(user)}:{sku}", qty, key=d.key, meta=d.meta)
    return qty


def apply_coupon(env: TrialEnv, user: str, code: str, d: Delivery) -> str:
    check_coupon(env, code)
    env.db.put("cart_coupons", _user(user), {"code": code}, key=d.key, meta=d.meta)
    return code


def check_coupon(env: TrialEnv, code: str) -> None:
    if env.db.get("coupons", code) is None:
        raise ToolError(f"422: coupon {code!r} is not valid")


def fill_field(env: TrialEnv, user: str, field: str, value: str, d: Delivery) -> str:
    """Type into one field of the account page's address form (a draft saved per field)."""
    if field not in ADDRESS_FIELDS:
        raise ToolError(f"422: no field addr-{field}; fields: {', '.join(ADDRESS_FIELDS)}")
    env.db.put("forms", draft_row(_user(user), field), value, key=d.key, meta=d.meta)
    return value


def draft_row(user: str, field: str) -> str:
    return f"{user}:address:{field}"


def draft(env: TrialEnv, user: str, *, log_read: bool = False, meta: Meta | None = None) -> dict[str, str]:
    values = {f: env.db.get("forms", draft_row(user, f), log_read=log_read, meta=meta) for f in ADDRESS_FIELDS}
    return {f: v for f, v in values.items() if v is not None}


def save_address(env: TrialEnv, user: str, d: Delivery) -> dict[str, Any]:
    """The form's [save-address] button: the draft becomes the profile's address."""
    typed = draft(env, _user(user))
    profile = {**env.db.get("profiles", user), **typed}
    env.db.put("profiles", user, profile, key=_sub(d.key, "profile"), meta=d.meta)
    for field in typed:
        env.db.delete("forms", draft_row(user, field), key=_sub(d.key, f"draft:{field}"), meta=d.meta)
    return profile


def toggle_newsletter(env: TrialEnv, user: str, d: Delivery) -> bool:
    """The account page's newsletter checkbox, clicked."""
    profile = dict(env.db.get("profiles", _user(user)))
    profile["newsletter"] = not profile["newsletter"]
    env.db.put("profiles", user, profile, key=d.key, meta=d.meta)
    return profile["newsletter"]


def post_review(env: TrialEnv, user: str, sku: str, stars: int, text: str, d: Delivery) -> int:
    """The product page's review form, posted: review number n of `sku`."""
    product(sku)
    if not isinstance(stars, int) or not 1 <= stars <= 5:
        raise ToolError(f"422: stars must be 1 to 5, got {stars!r}")
    n = (env.db.get("review_counts", sku) or 0) + 1
    env.db.put("reviews", f"{sku}:{n}", {"user": _user(user), "stars": stars, "text": text},
               key=_sub(d.key, "review"), meta=d.meta)
    env.db.put("review_counts", sku, n, key=_sub(d.key, "count"), meta=d.meta)
    return n


def book_pickup(env: TrialEnv, user: str, slot: str, d: Delivery) -> list[str]:
    """The pick-up page's [book] button: a place in a slot with limited capacity."""
    if replayed(env, d.key):
        return env.db.get("pickups", slot)["holders"]
    check_slot(env, user, slot)
    holders = [*env.db.get("pickups", slot)["holders"], user]
    env.db.put("pickups", slot, {"holders": holders}, key=d.key, meta=d.meta)
    return holders


def check_slot(env: TrialEnv, user: str, slot: str) -> None:
    if slot not in SLOTS:
        raise ToolError(f"404: no pick-up slot {slot!r}")
    holders = env.db.get("pickups", slot)["holders"]
    if _user(user) in holders:
        raise ToolError(f"409: {user} already holds {slot}")
    if len(holders) >= SLOT_CAPACITY:
        raise ToolError(f"409: slot {slot} is full")


def place_order(env: TrialEnv, user: str, d: Delivery) -> dict[str, Any]:
    """The cart's [place-order] button: an order for the cart's lines at the coupon's price,
    stock taken, the cart emptied, and a confirmation mailed (which can never be unsent).

    With a key, a repeated delivery places nothing more: each row write and the mail carry
    a key derived from it, and once the order row's key is applied the call only answers.
    """
    if replayed(env, _sub(d.key, "order")):
        return dict(REPLAYED)
    lines = cart_lines(env, _user(user))
    if not lines:
        raise ToolError("409: the cart is empty")
    for sku, qty in lines.items():
        if env.db.get("products", sku)["stock"] < qty:
            raise ToolError(f"409: only {env.db.get('products', sku)['stock']} of {sku} in stock")
    code = _coupon(env, user)
    total = _total(lines, COUPONS.get(code or "", 0))
    n = (env.db.get("order_counts", user) or 0) + 1
    order_id = f"{user}-{n}"
    ship_to = {f: env.db.get("profiles", user)[f] for f in ADDRESS_FIELDS}
    order = {"user": user, "lines": lines, "coupon": code, "total_cents": total, "ship_to": ship_to}
    env.db.put("orders", order_id, order, key=_sub(d.key, "order"), meta=d.meta)
    env.db.put("order_counts", user, n, key=_sub(d.key, "count"), meta=d.meta)
    for sku, qty in lines.items():
        row = env.db.get("products", sku)
        env.db.put("products", sku, {**row, "stock": row["stock"] - qty}, key=_sub(d.key, f"stock:{sku}"), meta=d.meta)
        env.db.delete("carts", f"{user}:{sku}", key=_sub(d.key, f"cart:{sku}"), meta=d.meta)
    if code is not None:
        env.db.delete("cart_coupons", user, key=_sub(d.key, "coupon"), meta=d.meta)
    items = ", ".join(f"{qty} x {product(sku).name}" for sku, qty in lines.items())
    env.mailbox.send(email(user), f"Order {order_id} confirmed",
                     f"{items}; total {total / 100:.2f}; ships to {ship_to['street']}, {ship_to['city']}",
                     key=_sub(d.key, "mail"), meta=d.meta)
    return {"order": order_id, "total_cents": total}


# -- before-images (what an undo restores) --------------------------------------------------------
Rows = list[tuple[str, str]]


def rows_before(env: TrialEnv, rows: Rows) -> dict[tuple[str, str], Any]:
    return {(t, k): env.db.get(t, k) for t, k in rows}


def restore_rows(env: TrialEnv, before: Mapping[tuple[str, str], Any], d: Delivery) -> None:
    for (table, k), value in before.items():
        key = _sub(d.key, f"undo:{table}:{k}")
        if value is None:
            env.db.delete(table, k, key=key, meta=d.meta)
        else:
            env.db.put(table, k, value, key=key, meta=d.meta)
