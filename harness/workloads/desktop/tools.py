"""The desktop's UI actions as tools, with the settlement metadata every mode reads.

Classes follow paper Table 4's OSWorld adapter: read-only actions carry no scope; typing,
saving, moving files, settings and mail-folder changes write the apps' own files and rows,
so an adapter can hold them until commit (bufferable); moving a file to the trash is
executed at once and compensated by restoring it (reversible: the action-specific
compensation Table 4 mentions); sending a mail can never be undone (irreversible: gated).
Every revocable action has a before-image of what it writes and an undo that restores it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from atomix.effects import EffectClass
from harness.workloads.desktop import apps
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery, ToolDef

B, R, IRR = EffectClass.BUFFERABLE, EffectClass.REVERSIBLE, EffectClass.IRREVERSIBLE
Args = dict[str, Any]


def _no_scopes(env: TrialEnv, a: Args) -> list[str]:
    return []


def _other(options: list[Any], current: Any, rng: random.Random) -> Any | None:
    rest = [o for o in options if o != current]
    return rest[rng.randrange(len(rest))] if rest else None


def _swap(args: Args, name: str, value: Any | None) -> Args | None:
    return None if value is None else {**args, name: value}


def _file_scopes(env: TrialEnv, app: str, element: str, *paths: str) -> list[str]:
    """The app's element for each file, plus the file itself (another app's view of it)."""
    out = []
    for path in paths:
        norm = apps.doc_path(path)
        out += [apps.ui(app, norm, element) if element else apps.ui(app, norm), env.files.scope(norm)]
    return out


def _doc_writes(env: TrialEnv, a: Args) -> list[str]:
    return _file_scopes(env, "editor", "text_input", a["path"])


def _doc_tool(name: str, run: Callable[[TrialEnv, Args, Delivery], Any], **extra: Any) -> ToolDef:
    return ToolDef(
        name, B, _no_scopes, _doc_writes, run,
        before=lambda env, a: apps.files_before(env, [a["path"]]),
        undo=lambda env, a, before, d: apps.restore_files(env, before, d),
        **extra,
    )


def _move_tool(name: str, effect: EffectClass, dst: Callable[[Args], str],
               run: Callable[[TrialEnv, Args, Delivery], Any], **extra: Any) -> ToolDef:
    return ToolDef(
        name, effect, _no_scopes,
        lambda env, a: _file_scopes(env, "files", "", a["path"], dst(a)), run,
        before=lambda env, a: apps.files_before(env, [a["path"], dst(a)]),
        undo=lambda env, a, before, d: apps.restore_files(env, before, d),
        check=lambda env, a: apps.check_move(env, a["path"], dst(a)),
        **extra,
    )


def _setting_tool(name: str, run: Callable[[TrialEnv, Args, Delivery], Any], **extra: Any) -> ToolDef:
    return ToolDef(
        name, B, _no_scopes, lambda env, a: [apps.ui("settings", a["section"], a["key"])], run,
        before=lambda env, a: env.db.get("settings", apps.setting_name(a["section"], a["key"])),
        undo=lambda env, a, before, d: env.db.put("settings", apps.setting_name(a["section"], a["key"]), before,
                                                  key=None, meta=d.meta),
        **extra,
    )


def _message_tool(name: str, run: Callable[[TrialEnv, Args, Delivery], Any], **extra: Any) -> ToolDef:
    return ToolDef(
        name, B, _no_scopes, lambda env, a: [apps.ui("mail", "inbox", a["msg"])], run,
        before=lambda env, a: env.db.get("inbox", a["msg"]),
        undo=lambda env, a, before, d: env.db.put("inbox", a["msg"], before, key=None, meta=d.meta),
        idempotent=True, **extra,
    )


def _setting_alternative(env: TrialEnv, a: Args, rng: random.Random) -> Args | None:
    current = apps.INITIAL_SETTINGS[apps.setting_name(a["section"], a["key"])]
    if isinstance(current, bool):
        return None
    if isinstance(current, int):
        return _swap(a, "value", _other([a["value"] - 1, a["value"] + 1], None, rng))
    return _swap(a, "value", _other(["light", "dark", "high-contrast"], a["value"], rng))


TOOLS: dict[str, ToolDef] = {
    t.name: t
    for t in (
        ToolDef("open_app", None, _no_scopes, _no_scopes, lambda env, a, d: apps.open_app(env, a["app"], d.meta)),
        ToolDef("read_doc", None, _no_scopes, _no_scopes, lambda env, a, d: apps.read_doc(env, a["path"], d.meta)),
        _doc_tool(
            "type_text", lambda env, a, d: apps.type_text(env, a["path"], a["text"], d),
            check=lambda env, a: apps.check_exists(env, a["path"]),
        ),
        _doc_tool(
            "replace_text", lambda env, a, d: apps.replace_text(env, a["path"], a["old"], a["new"], d),
            check=lambda env, a: apps.check_contains(env, a["path"], a["old"]),
        ),
        _doc_tool("new_doc", lambda env, a, d: apps.new_doc(env, a["path"], a["text"], d), idempotent=True),
        _move_tool("move_file", B, lambda a: a["dst"], lambda env, a, d: apps.move_file(env, a["path"], a["dst"], d)),
        _move_tool("trash_file", R, lambda a: apps.trash_path(a["path"]),
                   lambda env, a, d: apps.trash_file(env, a["path"], d)),
        _setting_tool(
            "set_setting", lambda env, a, d: apps.set_setting(env, a["section"], a["key"], a["value"], d),
            idempotent=True, check=lambda env, a: apps.check_setting(env, a["section"], a["key"], a["value"]),
            alternatives=_setting_alternative,
        ),
        _setting_tool(
            "toggle_setting", lambda env, a, d: apps.toggle_setting(env, a["section"], a["key"], d),
            check=lambda env, a: apps.check_switch(env, a["section"], a["key"]),
        ),
        _message_tool("mark_read", lambda env, a, d: apps.mark_read(env, a["msg"], d)),
        _message_tool(
            "move_message", lambda env, a, d: apps.move_message(env, a["msg"], a["folder"], d),
            check=lambda env, a: apps.check_folder(env, a["msg"], a["folder"]),
            alternatives=lambda env, a, rng: _swap(a, "folder", _other(list(apps.FOLDERS), a["folder"], rng)),
        ),
        ToolDef(
            "send_mail", IRR, _no_scopes,
            lambda env, a: [apps.ui("mail", "compose"), env.mailbox.scope(a["to"])],
            lambda env, a, d: apps.send_mail(env, a["to"], a["subject"], a["body"], d),
            alternatives=lambda env, a, rng: _swap(a, "to", _other(list(apps.CONTACTS), a["to"], rng)),
        ),
    )
}
