"""The command a systemd unit runs, read as systemd reads it: the unit's
sections, its specifiers (``%i``, ``%H``...), its environment files and the
variables of ``ExecStart=`` (systemd.unit(5), systemd.exec(5),
systemd.service(5) "Command lines").

Only what wheel's units use is understood; anything else (a line
continuation, an ``ExecStart=`` prefix, an unknown specifier, an escape in
an environment file) raises rather than being read some other way than
systemd would.
"""

from __future__ import annotations

import re
import shlex
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Unit",
    "allowed_syscalls",
    "read_environment_file",
    "strace_summary_calls",
    "syscall_groups",
]

_SPECIFIER = re.compile(r"%(.)")
_WHOLE_VAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
_BRACED_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)")
_SECONDS = {"": 1.0, "s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0}


@dataclass(frozen=True, slots=True, kw_only=True)
class Unit:
    """A unit file's settings, by section, in the file's order (a key may
    come more than once), with the unit's name (``wheel-worker@a.service``
    for an instance of a template)."""

    name: str
    instance: str | None
    settings: tuple[tuple[str, str, str], ...]  # (section, key, raw value)

    @classmethod
    def load(cls, path: Path, instance: str | None = None) -> Unit:
        """``instance``: the name after ``@`` for a template (``x@.service``)."""
        template = path.name.endswith("@.service")
        if template != (instance is not None):
            raise ValueError(f"{path.name}: an instance name goes with a template unit only")
        name = path.name.replace("@.", f"@{instance}.") if instance is not None else path.name
        settings: list[tuple[str, str, str]] = []
        section = ""
        for n, raw in enumerate(path.read_text().splitlines(), 1):
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            if line.endswith("\\"):
                raise ValueError(f"{path}:{n}: line continuations are not read here")
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
                continue
            key, sep, value = line.partition("=")
            if not sep or not section:
                raise ValueError(f"{path}:{n}: not a setting: {raw!r}")
            settings.append((section, key.strip(), value.strip()))
        return cls(name=name, instance=instance, settings=tuple(settings))

    def specifiers(self, text: str) -> str:
        """``text`` with the unit's specifiers resolved, as systemd does when
        it loads the unit."""

        def one(m: re.Match[str]) -> str:
            spec = m.group(1)
            if spec == "%":
                return "%"
            if spec == "n":
                return self.name
            if spec == "H":
                return socket.gethostname()
            if spec in ("i", "I") and self.instance is not None:
                return self.instance
            raise ValueError(f"{self.name}: specifier %{spec} is not read here")

        return _SPECIFIER.sub(one, text)

    def all(self, key: str, section: str = "Service") -> list[str]:
        """Every value of ``key`` in ``section``, specifiers resolved."""
        return [self.specifiers(v) for s, k, v in self.settings if s == section and k == key]

    def one(self, key: str, section: str = "Service") -> str:
        values = self.all(key, section)
        if len(values) != 1:
            raise KeyError(f"{self.name}: [{section}] {key}= set {len(values)} times")
        return values[0]

    def seconds(self, key: str, section: str = "Service") -> float:
        """A time span such as ``45s``, ``45`` or ``2min``, in seconds."""
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]*)", self.one(key, section))
        if m is None or m.group(2) not in _SECONDS:
            raise ValueError(f"{self.name}: {key}= is not a span read here")
        return float(m.group(1)) * _SECONDS[m.group(2)]

    def environment(self, read: Mapping[str, str]) -> dict[str, str]:
        """The variables the unit's ``Environment=`` and ``EnvironmentFile=``
        settings give, in order (a later one wins). ``read`` maps each file's
        path, as the unit names it, to its text; a file missing from it is an
        error unless the unit names it with ``-`` (optional)."""
        env: dict[str, str] = {}
        for s, key, raw in self.settings:
            if s != "Service":
                continue
            if key == "Environment":
                for word in shlex.split(self.specifiers(raw)):
                    name, _, value = word.partition("=")
                    env[name] = value
            elif key == "EnvironmentFile":
                path = self.specifiers(raw)
                optional = path.startswith("-")
                path = path.removeprefix("-")
                if path in read:
                    env.update(read_environment_file(read[path]))
                elif not optional:
                    raise FileNotFoundError(f"{self.name}: EnvironmentFile={path}")
        return env

    def command(self, env: Mapping[str, str], key: str = "ExecStart") -> list[str]:
        """The argv of ``key`` with ``env`` (the service's environment)
        substituted: ``$NAME`` standing as a word of its own becomes the
        value's words (split at whitespace; none when empty), ``${NAME}``
        anywhere becomes the value as it is (empty when unset)."""
        line = self.one(key)
        if line[:1] in "-@:+!|":
            raise ValueError(f"{self.name}: {key}= prefixes are not read here")
        argv: list[str] = []
        for word in shlex.split(line):
            whole = _WHOLE_VAR.fullmatch(word)
            if whole is not None:
                argv.extend(env.get(whole.group(1), "").split())
                continue
            argv.append(_BRACED_VAR.sub(lambda m: env.get(m.group(1), ""), word))
        return argv


def read_environment_file(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines as systemd's ``EnvironmentFile=`` reads them:
    comments (``#``, ``;``) and blank lines skipped, a value in double or
    single quotes taken without them, an unquoted one stripped."""
    env: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        m = _ASSIGNMENT.fullmatch(line)
        if m is None:
            raise ValueError(f"line {n}: not KEY=VALUE: {raw!r}")
        name, value = m.group(1), m.group(2).strip()
        if "\\" in value:
            raise ValueError(f"line {n}: escapes are not read here")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        elif any(q in value for q in "\"'"):
            raise ValueError(f"line {n}: quotes around part of a value are not read here")
        env[name] = value
    return env


def syscall_groups(analyze: str) -> dict[str, list[str]]:
    """The system call groups of this machine's systemd (``@system-service``
    and the others), from ``systemd-analyze syscall-filter``: each group's
    members, system calls and groups."""
    out = subprocess.run(
        [analyze, "syscall-filter"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    groups: dict[str, list[str]] = {}
    members: list[str] = []
    for line in out.splitlines():
        if line.startswith("@"):
            members = groups.setdefault(line.split()[0], [])
        elif line.startswith(" ") and line.strip() and not line.strip().startswith("#"):
            members.append(line.strip())
    return groups


def allowed_syscalls(unit: Unit, groups: Mapping[str, list[str]]) -> frozenset[str]:
    """The system calls ``unit``'s ``SystemCallFilter=`` settings allow: an
    allow list, then what a ``~`` setting takes out of it, in order."""

    def expand(name: str) -> set[str]:
        if not name.startswith("@"):
            return {name}
        return set().union(*(expand(m) for m in groups[name]))

    allowed: set[str] | None = None
    for value in unit.all("SystemCallFilter"):
        deny = value.startswith("~")
        names = set().union(*(expand(w) for w in value.removeprefix("~").split()))
        if allowed is None:
            if deny:
                raise ValueError(f"{unit.name}: a deny list alone is not read here")
            allowed = names
        elif deny:
            allowed -= names
        else:
            allowed |= names
    if allowed is None:
        raise ValueError(f"{unit.name}: no SystemCallFilter=")
    return frozenset(allowed)


def strace_summary_calls(summary: str) -> set[str]:
    """The system calls ``strace -c`` counted (its table's last column)."""
    calls: set[str] = set()
    for line in summary.splitlines():
        words = line.split()
        if len(words) >= 5 and words[0][0].isdigit() and words[-1] != "total":
            calls.add(words[-1])
    return calls
