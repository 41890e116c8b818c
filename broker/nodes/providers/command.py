"""Node provider that runs a site's own scripts (any other rental platform).

The contract (docs/PROVIDERS.md has the full text and an example):

    resume_argv + NODE...     stdin: {"cluster": C, "nodes": [{name, partition,
                              capacity, instance_type, generation}, ...]}.
                              Exit 0 once every node's instance exists (pending
                              is fine). Stdout: empty, or a list document.
    suspend_argv + NODE...    terminate those nodes' instances; unknown nodes
                              are not an error (exit 0).
    list_argv                 stdout: {"instances": [{instance_id, node, capacity,
                              state, launched_at, private_ip?, partition?,
                              instance_type?, interrupted?}, ...]}: every
                              instance of cluster C, in any state.
    terminate_argv + ID...    optional: terminate exactly these instances.

Every command gets GBROKER_CLUSTER in its environment, runs without a shell,
and must finish within ``timeout_s``. Idempotency does not rest on the script
alone: resume lists first and only passes nodes with no alive instance.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from broker.nodes.providers.base import (
    Instance,
    InstanceState,
    NodeRequest,
    Provider,
    ProviderCommandError,
    ProviderConfigError,
    ProviderError,
    ResumeIncomplete,
    parse_capacity,
    pick_current,
)
from broker.nodes.providers.runner import DEFAULT_TIMEOUT_SECONDS, CommandResult, run_argv

STDOUT_EXCERPT_CHARS = 300


class CommandProvider(Provider):
    """Nodes as whatever the site's resume/suspend/list commands manage."""

    name = "command"

    def __init__(
        self,
        resume_argv: Sequence[str],
        suspend_argv: Sequence[str],
        list_argv: Sequence[str],
        *,
        terminate_argv: Sequence[str] | None = None,
        cluster_name: str = "gbroker",
        timeout_s: float = DEFAULT_TIMEOUT_SECONDS,
        env: dict[str, str] | None = None,
    ) -> None:
        for key, argv in (("resume_argv", resume_argv), ("suspend_argv", suspend_argv),
                          ("list_argv", list_argv)):
            _check_argv(key, argv)
        if terminate_argv is not None:
            _check_argv("terminate_argv", terminate_argv)
        if timeout_s <= 0:
            raise ProviderConfigError(f"timeout_s must be positive, not {timeout_s!r}",
                                      hint="give seconds, e.g. 120")
        self.resume_argv = [str(a) for a in resume_argv]
        self.suspend_argv = [str(a) for a in suspend_argv]
        self.list_argv = [str(a) for a in list_argv]
        self.terminate_argv = [str(a) for a in terminate_argv] if terminate_argv else None
        self.cluster_name = cluster_name
        self.timeout_s = timeout_s
        self.env = {**(env or {}), "GBROKER_CLUSTER": cluster_name}

    # ------------------------------------------------------------------ contract

    def instances(self) -> list[Instance]:
        res = self._run(self.list_argv, what="list command")
        return parse_instances(res, self.list_argv)

    def resume(self, nodes: list[NodeRequest]) -> list[Instance]:
        if not nodes:
            return []
        current = {n.name: pick_current(i for i in self.instances() if i.node_name == n.name)
                   for n in nodes}
        missing = [n for n in nodes if current[n.name] is None]
        if missing:
            doc = {
                "cluster": self.cluster_name,
                "nodes": [
                    {
                        "name": n.name,
                        "partition": n.partition,
                        "capacity": n.capacity.value,
                        "instance_type": n.instance_type,
                        "generation": n.generation,
                    }
                    for n in missing
                ],
            }
            argv = self.resume_argv + [n.name for n in missing]
            res = self._run(argv, stdin=json.dumps(doc), what="resume command")
            launched = parse_instances(res, argv) if res.stdout.strip() else self.instances()
            for n in missing:
                current[n.name] = pick_current(i for i in launched if i.node_name == n.name)
        result = [current[n.name] for n in nodes]
        failures: dict[str, ProviderError] = {
            n.name: ProviderError(
                f"the resume command exited 0 but lists no pending or running instance for {n.name}",
                hint="the resume command must exit 0 only once each node's instance exists "
                "(and the list command must show it)",
            )
            for n, inst in zip(nodes, result, strict=False) if inst is None
        }
        found = [i for i in result if i is not None]
        if failures:
            raise ResumeIncomplete(found, failures)
        return found

    def suspend(self, names: list[str]) -> None:
        if names:
            self._run(self.suspend_argv + list(names), what="suspend command")

    def terminate(self, instance_ids: list[str]) -> None:
        if not instance_ids:
            return
        if self.terminate_argv is None:
            super().terminate(instance_ids)
            return
        self._run(self.terminate_argv + list(instance_ids), what="terminate command")

    # ------------------------------------------------------------------ helpers

    def _run(self, argv: list[str], *, stdin: str | None = None, what: str) -> CommandResult:
        return run_argv(argv, stdin=stdin, timeout_s=self.timeout_s, env=self.env, what=what)


def parse_instances(res: CommandResult, argv: Sequence[str]) -> list[Instance]:
    """Read the list document; a malformed one is an error that quotes it."""

    def bad(problem: str) -> ProviderCommandError:
        excerpt = res.stdout.strip()[:STDOUT_EXCERPT_CHARS]
        return ProviderCommandError(
            f"{argv[0]} printed an invalid instance list: {problem}\n  stdout: {excerpt!r}",
            argv=argv,
            returncode=0,
            stderr=res.stderr,
            hint='print {"instances": [{"instance_id", "node", "capacity", "state", '
            '"launched_at"}, ...]} (see docs/PROVIDERS.md)',
        )

    try:
        doc = json.loads(res.stdout)
    except json.JSONDecodeError as exc:
        raise bad(f"not JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("instances"), list):
        raise bad('expected an object with an "instances" list')
    out: list[Instance] = []
    for n, item in enumerate(doc["instances"]):
        if not isinstance(item, dict):
            raise bad(f"instances[{n}] is not an object")
        try:
            out.append(_instance(item))
        except (KeyError, TypeError, ValueError, ProviderConfigError) as exc:
            raise bad(f"instances[{n}]: {type(exc).__name__}: {exc}") from exc
    return out


def _instance(item: dict[str, Any]) -> Instance:
    launched = datetime.fromisoformat(str(item["launched_at"]))
    if launched.tzinfo is None:
        raise ValueError("launched_at needs a UTC offset (e.g. 2026-09-01T12:00:00+00:00)")
    interrupted = item.get("interrupted", False)
    if not isinstance(interrupted, bool):
        raise TypeError("interrupted must be true or false")
    return Instance(
        instance_id=str(item["instance_id"]),
        node_name=str(item["node"] or ""),
        capacity=parse_capacity(item["capacity"]),
        state=InstanceState.parse(str(item["state"])),
        launched_at=launched.astimezone(UTC),
        private_ip=item.get("private_ip"),
        partition=str(item.get("partition") or ""),
        instance_type=str(item.get("instance_type") or ""),
        interrupted=interrupted,
    )


def _check_argv(key: str, argv: Any) -> None:
    if isinstance(argv, str) or not isinstance(argv, Sequence) or not argv:
        raise ProviderConfigError(
            f"{key} must be a non-empty list of arguments, not {argv!r}",
            hint=f'write it as a list, e.g. {key} = ["/opt/site/cloud", "{key.split("_")[0]}"] '
            "(no shell: no pipes, quotes or $VARS)",
        )
