"""The ``fabricpilot`` command line: thin over the library.

Errors: every :class:`~fabricpilot.errors.FabricpilotError` becomes one line on stderr
(``error: FILE: FIELD: PROBLEM``) and exit status 2. Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any, get_args

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fabricpilot import __version__
from fabricpilot.balancing import POLICIES
from fabricpilot.errors import FabricpilotError, SimulationError
from fabricpilot.textfiles import written_whole
from fabricpilot.topology.builders import MAX_GPUS
from fabricpilot.units import UnitError, parse_quantity

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    help="fabricpilot: a digital twin and task-aware control plane for AI-training fabrics.",
)
topology_app = typer.Typer(no_args_is_help=True, help="Inspect and export topologies.")
app.add_typer(topology_app, name="topology")


def _stdout_gone() -> None:
    """The reader of stdout left (``fabricpilot run | head``): what is still printed goes
    nowhere and the command goes on, so that the files it was asked for are still written
    and its errors still reach stderr (instead of a silent exit at the first line lost)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


class _Out(Console):
    """The console of stdout, going on when its reader leaves (:func:`_stdout_gone`; rich's
    own exits with status 1 there, before a run writes its ``--json`` and ``--out``)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        _stdout_gone()


def _print(*args: Any, **kwargs: Any) -> None:
    """``print`` to stdout, going on if its reader left (:func:`_stdout_gone`)."""
    try:
        print(*args, **kwargs)
    except BrokenPipeError:
        _stdout_gone()


# tables stay readable when the output is a pipe or a file (rich would assume 80 columns)
out = _Out(width=None if sys.stdout.isatty() else 110)
err = Console(stderr=True)

EXIT_INPUT = 2

_FLAG = ""  # a flag's metavar: none (typer 0.29 shows "<bool>", as if it took a value)

# (a run whose end passes int64 ns: each value within its limits, together beyond them)
_OVERFLOW = ("the simulated time passed the engine's clock (2^63 ns, 292 years): rates too "
             "low for the bytes they carry")


def _output_path(text: str) -> Path:
    """An output path as given: an empty one (an unset shell variable, most likely) is
    refused rather than read as the current folder.

    >>> _output_path("out/run1")
    PosixPath('out/run1')
    """
    if not text.strip():
        raise typer.BadParameter("empty path")
    return Path(text)


def _fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_INPUT)


def _warn(source: str, lines: list[str]) -> None:
    """One ``warning: FILE: FIELD: MESSAGE`` line on stderr per line; the exit status is kept."""
    for line in lines:
        err.print(f"[yellow]warning:[/] {escape(source)}: {escape(line)}", highlight=False,
                  soft_wrap=True)


def _load(scenario: Path | None):  # type: ignore[no-untyped-def]
    from fabricpilot.scenario import default_scenario, default_scenario_path, load_scenario

    if scenario is None:
        return default_scenario(), str(default_scenario_path().name)
    return load_scenario(scenario), str(scenario)


@app.command()
def run(
    scenario: Annotated[Path | None, typer.Argument(
        metavar="SCENARIO",
        help="Scenario YAML; the built-in default scenario when omitted.")] = None,
    policy: Annotated[list[str] | None, typer.Option(
        "--policy", "-p", help="Policy to run (repeat to compare); default: scenario's.")] = None,
    json_path: Annotated[Path | None, typer.Option(
        "--json", parser=_output_path,
        help="Write the JSON summary here ('-': to stdout, the tables then to stderr).")
    ] = None,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", parser=_output_path,
        help="Write CSV tables (flows, collectives, iterations, links; with "
             "--interference also interference; with the fluid model also "
             "timeseries, ports) here, one sub-folder per policy, and report.html with "
             "its plots/; what an earlier run wrote here and this one does not is removed.")]
        = None,
    reproducible: Annotated[bool, typer.Option(
        metavar=_FLAG,
        help="Leave wall-clock figures out (wall_time_s and heal times as 0, no heal times "
             "in the report) so that equal seeds give byte-identical JSON and report.")] = False,
    seed: Annotated[int | None, typer.Option(help="Override the scenario's seed.")] = None,
    with_interference: Annotated[bool, typer.Option(
        "--interference", metavar=_FLAG,
        help="Also run every job alone (same seed, policy and mice, without the other jobs) "
             "and report busbw alone / busbw shared per job and policy; one extra run per "
             "job and policy.")] = False,
) -> None:
    """Run one or several routing policies on a scenario and compare them."""
    from fabricpilot.report import (
        ABOVE_REFERENCE,
        above_reference,
        comparison_table,
        controller_line,
        fabric_table,
        fault_table,
        pfc_event_lines,
        run_notes,
    )
    from fabricpilot.report.plots import write_report
    from fabricpilot.results import summary_json, write_tables
    from fabricpilot.runner import config_warnings, interference, prepare, run_policy

    source: str | None = None  # (named in errors once the scenario is read)
    # `--json -`: the summary is stdout (for a pipe: `| jq`), the tables go to stderr
    to_stdout = json_path is not None and str(json_path) == "-"
    con = err if to_stdout else out
    json_path = None if to_stdout else json_path
    try:
        if seed is not None and seed < 0:
            _fail(f"--seed: must be >= 0, got {seed}")
        _check_outputs(json_path, out_dir)
        sc, source = _load(scenario)
        if seed is not None:
            sc = sc.model_copy(update={"seed": seed})
        for i, name in enumerate(policy or []):
            if name not in POLICIES:
                _fail(f"--policy: unknown policy {name!r} (known: {', '.join(sorted(POLICIES))})")
            if name in (policy or [])[:i]:
                _fail(f"--policy: policy {name!r} given twice")
        policies = list(policy) if policy else list(sc.policies)
        # the comparison is against `ideal`; run it as the reference if it was not asked for
        runs = policies + (["ideal"] if "ideal" not in policies else [])
        _check_collisions(json_path, out_dir, policies, _inputs(scenario, sc))
        if out_dir is not None:
            _check_out_layout(out_dir, policies)
        prep = prepare(sc, source, runs)
        _warn(source, config_warnings(sc, prep))
        con.print(f"[bold]{escape(sc.name)}[/]: {escape(prep.topology.topo.summary())}; "
                  f"{_count(len(prep.jobs), 'job')}"
                  + (f", {_count(len(prep.mice), 'mouse', 'mice')}" if prep.mice else ""),
                  highlight=False, soft_wrap=True)
        total_units = sum(j.iterations * len(j.collectives) for j in prep.jobs)
        results = []
        crashed: list[str] = []  # (a policy's defect: the other policies' results are kept)
        with Progress(TextColumn("{task.description:<8}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("collectives"), TimeElapsedColumn(), console=err,
                      transient=True, disable=not err.is_terminal) as bar:
            # (no bar where stderr is not a terminal: its last frame left an empty line)
            for name in runs:
                task = bar.add_task(name, total=total_units)
                try:
                    results.append(run_policy(
                        prep, name,
                        progress=lambda d, t, task=task: bar.update(task, completed=d)))
                except SimulationError as e:  # (this policy's run could not go on)
                    crashed.append(f"policy {name}: {e}")
                except (FabricpilotError, OverflowError):
                    raise  # (bad input: one line, as always)
                except Exception as e:  # (a defect: reported, the other policies go on)
                    crashed.append(_crash_line(name, e, out_dir))
            shown = [r for r in results if r.policy in policies]
            if not shown:
                _fail("; ".join(crashed))
            if with_interference:
                # one bar per policy over its alone runs: a job's units follow the previous jobs'
                units = [j.iterations * len(j.collectives) for j in prep.jobs]
                offset = {j.name: sum(units[:i]) for i, j in enumerate(prep.jobs)}
                for r in shown:
                    task = bar.add_task(f"{r.policy} alone", total=total_units)
                    try:
                        r.interference = interference(
                            prep, r.policy, r,
                            progress=lambda job, d, t, task=task: bar.update(
                                task, completed=offset[job] + d))
                    except SimulationError as e:  # (its shared run's results stand)
                        crashed.append(f"policy {r.policy}, a job alone: {e}")
        reference = next((r for r in results if r.policy == "ideal"), None)
        con.print(comparison_table(shown, reference))
        if reference is not None and "ideal" not in policies:  # (its figures, to check by)
            ref = ", ".join(f"{escape(j.name)} {reference.mean_busbw_GBps(j.name):.1f}"
                            for j in prep.jobs)
            con.print(f"of ideal: against `ideal` (run as the reference), busbw GB/s {ref}",
                      highlight=False, soft_wrap=True)
        above = above_reference(shown, reference)
        if above:
            con.print(f"above ideal: {escape(', '.join(above))}; {ABOVE_REFERENCE}",
                      highlight=False, soft_wrap=True)
        con.print(fabric_table(shown))
        faults = fault_table(shown, width=con.width)
        if faults is not None:
            con.print(faults)
        for line in run_notes(shown):
            con.print(escape(line), highlight=False, soft_wrap=True)
        for r in shown:
            if r.controller:
                con.print(escape(controller_line(r)), highlight=False, soft_wrap=True)
        events = pfc_event_lines(shown)
        if events:
            con.print("PFC storms and deadlocks:")
            for line in events:
                con.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
        failed = []  # (one output that cannot be written does not lose the other)
        if to_stdout:
            _print(summary_json(shown, include_wall_time=not reproducible,
                                reference=reference).rstrip("\n"), flush=True)
        if json_path is not None:
            try:
                json_path.parent.mkdir(parents=True, exist_ok=True)
                with written_whole(json_path) as fh:
                    fh.write(summary_json(shown, include_wall_time=not reproducible,
                                          reference=reference))
                con.print(f"summary written to {escape(str(json_path))}", highlight=False,
                          soft_wrap=True)
            except OSError as e:
                failed.append(f"--json: cannot write {json_path}: {e.strerror or e}")
        if out_dir is not None:
            try:
                for r in shown:
                    write_tables(r, out_dir / r.policy)
                _drop_earlier_policies(out_dir, {r.policy for r in shown})
                write_report(shown, reference, out_dir, include_wall_time=not reproducible)
            except OSError as e:
                failed.append(f"--out: cannot write {e.filename or out_dir}: {e.strerror or e}")
                out_dir = None
        if out_dir is not None:
            for r in shown:
                ts = r.model_report.timeseries if r.model_report is not None else None
                if ts is not None and ts.interval_ns > sc.fabric.fluid.sample_interval_ns:
                    con.print(f"{r.policy}: timeseries.csv has one sample every "
                              f"{ts.interval_ns / 1e3:g} us (configured "
                              f"{sc.fabric.fluid.sample_interval_ns / 1e3:g} us; the run needed "
                              f"more than fabric.fluid.max_timeseries_rows="
                              f"{sc.fabric.fluid.max_timeseries_rows:,} rows)", highlight=False,
                              soft_wrap=True)
            con.print(escape(f"tables written to {out_dir}/<policy>/, plots and report to "
                             f"{out_dir}/report.html"), highlight=False, soft_wrap=True)
        if failed or crashed:
            _fail("; ".join(crashed + failed))
    except FabricpilotError as e:
        _fail(_in_source(str(e), source))
    except OverflowError:
        _fail(_in_source(_OVERFLOW, source))


def _crash_line(policy: str, error: Exception, out_dir: Path | None) -> str:
    """One line on a policy whose run failed on a defect (not on its input), naming the
    file its traceback went to (under ``--out`` if given, else a temporary file), so that
    the other policies' results can still be shown and written."""
    import traceback

    text = "".join(traceback.format_exception(error))
    try:
        if out_dir is not None:
            (out_dir / policy).mkdir(parents=True, exist_ok=True)
            path = out_dir / policy / "traceback.txt"
            path.write_text(text, encoding="utf-8")
        else:
            fd, name = tempfile.mkstemp(prefix=f"fabricpilot-{policy}-", suffix=".txt")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            path = Path(name)
        where = f"traceback in {path}"
    except OSError as err:
        where = f"its traceback could not be written: {err.strerror or err}"
    first = str(error).splitlines()[0] if str(error) else ""
    return f"policy {policy} failed: {type(error).__name__}: {first} ({where})"


def _count(n: int, one: str, many: str | None = None) -> str:
    """``n`` things, singular or plural.

    >>> _count(1, "job"), _count(3, "job"), _count(1, "mouse", "mice")
    ('1 job', '3 jobs', '1 mouse')
    """
    return f"{n} {one if n == 1 else many or one + 's'}"


def _in_source(message: str, source: str | None) -> str:
    """An error's line, naming the scenario it came from if it does not already.

    >>> _in_source("adaptive.reserved_spines: too many", "my.yaml")
    'my.yaml: adaptive.reserved_spines: too many'
    >>> _in_source("my.yaml: jobs[0].gpus: too many", "my.yaml")
    'my.yaml: jobs[0].gpus: too many'
    """
    return message if source is None or message.startswith(f"{source}:") else \
        f"{source}: {message}"


def _inputs(scenario: Path | None, sc: Any) -> list[Path]:
    """The files a scenario was read from: its YAML and, for ``topology.kind: file``, the
    topology's JSON (none for the built-in default scenario)."""
    files = [scenario] if scenario is not None else []
    if sc.topology.kind == "file" and sc.topology.path is not None:
        files.append(Path(sc.topology.path))
    return files


def _within(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or lies under it (both as they resolve)."""
    p, f = path.resolve(), folder.resolve()
    return p == f or f in p.parents


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file: the same path once resolved, or two links
    (hard or symbolic) to one file that exists.

    >>> _same_file(Path("/tmp/../tmp/x"), Path("/tmp/x"))
    True
    """
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # (one of them does not exist yet)
        return False


def _written_by_out(path: Path, out_dir: Path, policies: list[str]) -> bool:
    """Whether ``--out out_dir`` writes ``path``: its ``report.html``, or a file under its
    ``plots/`` or a policy's folder."""
    return (_same_file(path, out_dir / "report.html")
            or any(_within(path, out_dir / sub) for sub in ("plots", *policies)))


def _cleared_by_out(path: Path, out_dir: Path, policies: list[str]) -> bool:
    """Whether ``--out out_dir`` removes ``path``: a table an earlier run left in the folder
    of a policy this run does not show (:func:`_drop_earlier_policies`)."""
    from fabricpilot.results.io import TABLE_FILES

    return any(_same_file(path, out_dir / p / name)
               for p in sorted(set(POLICIES) - set(policies)) for name in TABLE_FILES)


def _check_collisions(json_path: Path | None, out_dir: Path | None, policies: list[str],
                      inputs: list[Path]) -> None:
    """Fail before the runs if an output would overwrite an input or another output: the
    JSON summary or the tables' folder the scenario (or its topology file), or the JSON
    summary a file ``--out`` writes (``report.html``, ``plots/``, a policy's folder) or
    removes (a table of a policy not run)."""
    for inp in inputs:
        if json_path is not None and _same_file(json_path, inp):
            _fail(f"--json: {json_path} is the input {inp}: it would be overwritten")
        if out_dir is not None and _written_by_out(inp, out_dir, policies):
            _fail(f"--out: {out_dir} would overwrite the input {inp}")
        if out_dir is not None and _cleared_by_out(inp, out_dir, policies):
            _fail(f"--out: {out_dir} would remove the input {inp} (a table of a policy "
                  "not run)")
    if json_path is None or out_dir is None:
        return
    if json_path.resolve() == out_dir.resolve():
        _fail(f"--json, --out: both name {json_path} (a file and a folder)")
    if _written_by_out(json_path, out_dir, policies):
        _fail(f"--json: {json_path} is among what --out writes ({out_dir}/report.html, "
              f"{out_dir}/plots/, {out_dir}/<policy>/): it would be overwritten")
    if _cleared_by_out(json_path, out_dir, policies):
        _fail(f"--json: {json_path} is a table --out removes (of a policy not run): it "
              "would be lost")


def _drop_earlier_policies(out_dir: Path, shown: set[str]) -> None:
    """The tables an earlier run wrote under ``out_dir`` for policies this one does not
    show are removed (with their folder, if nothing else is in it): the report would not
    name them, and they would read as this run's."""
    from fabricpilot.results.io import TABLE_FILES, remove_stale

    for policy in sorted(set(POLICIES) - shown):
        folder = out_dir / policy
        if folder.is_dir():
            remove_stale(folder, TABLE_FILES, [])
            with contextlib.suppress(OSError):  # (not empty: the user's files stay)
                folder.rmdir()


def _check_out_layout(out_dir: Path, policies: list[str]) -> None:
    """Fail at once (not after the runs, with nothing written) if something already in
    ``out_dir`` stands where ``--out`` writes: a file where a policy's folder or ``plots/``
    goes, a folder where ``report.html``, a table or a plot goes."""
    from fabricpilot.report.plots import PLOT_FILES
    from fabricpilot.results.io import TABLE_FILES

    folders = [(out_dir / p, TABLE_FILES) for p in policies] + [(out_dir / "plots",
                                                                  PLOT_FILES)]
    files = [out_dir / "report.html"]
    for folder, names in folders:
        if folder.exists() and not folder.is_dir():
            _fail(f"--out: {folder} is a file, where the folder {folder.name}/ goes")
        files += [folder / n for n in names]
    for f in files:
        if f.is_dir():
            _fail(f"--out: {f} is a directory, where the file {f.name} goes")


def _check_outputs(json_path: Path | None, out_dir: Path | None, json_flag: str = "--json",
                   ) -> None:
    """Fail at once (not after the runs) if ``--json`` (``json_flag``: the file's option or
    argument) or ``--out`` cannot be written: a path through a file, a directory for the
    JSON file, a file for the tables' folder, or a folder not writable."""
    for flag, path, is_dir in ((json_flag, json_path, False), ("--out", out_dir, True)):
        if path is None:
            continue
        if path.exists() and path.is_dir() != is_dir:
            _fail(f"{flag}: {path} is {'a file' if is_dir else 'a directory'}")
        # the nearest existing folder must be a writable folder
        at = path if is_dir and path.exists() else path.parent
        while not at.exists() and at != at.parent:
            at = at.parent
        if not at.is_dir():
            _fail(f"{flag}: {path}: {at} is not a directory")
        # (a file made and dropped there: permission bits alone say yes to root, also
        # where nothing can be written, as /proc)
        try:
            with tempfile.TemporaryFile(dir=at):
                pass
        except OSError as err:
            _fail(f"{flag}: {path}: {at} is not writable ({err.strerror or err})")


_MAX_BODY_BYTES = 1 << 30  # serve --max-body at most (a limit in petabytes is none)
_TIME_SCALE = 1e-3  # the twin's fabric seconds per wall second unless given


@app.command()
def serve(
    scenario: Annotated[Path | None, typer.Argument(
        metavar="SCENARIO",
        help="Scenario whose fabric (and jobs, run on the twin) the controller serves; "
             "the built-in default scenario when omitted.")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8765,
    state_dir: Annotated[Path, typer.Option(
        "--state-dir", help="Where the SQLite state (jobs, paths, faults) and the generated "
                            "operator token live; reused on restart.")]
        = Path("fabricpilot-state"),
    tokens_file: Annotated[Path | None, typer.Option(
        "--tokens", help="Token file (YAML: name, role operator|tenant, tenant, token or "
                         "sha256, gpus). Default: one operator token in the state dir.")]
        = None,
    twin: Annotated[bool, typer.Option(
        metavar=_FLAG,
        help="Run the scenario's jobs on the twin in scaled real time (--no-twin: the "
             "fabric only; telemetry comes from POST /api/v1/telemetry).")] = True,
    time_scale: Annotated[float | None, typer.Option(
        help="Fabric seconds per wall second of the in-process twin (default 1e-3: 1 ms "
             "per second).")] = None,
    tick_interval: Annotated[float, typer.Option(
        help="Wall seconds between control periods.")] = 0.2,
    telemetry_interval: Annotated[float | None, typer.Option(
        help="Wall seconds between the switches' telemetry reports, if not one per control "
             "period (--no-twin or --dataplane): the congestion map smooths once per "
             "report interval.")] = None,
    plan_interval: Annotated[float, typer.Option(
        help="Wall seconds between plans of declared changes (changes arriving meanwhile "
             "are planned together).")] = 0.25,
    max_body: Annotated[str, typer.Option(help="Largest request body (at most 1GiB).")] = "8MiB",
    dataplane: Annotated[str | None, typer.Option(
        help="URL of a data plane in its own process (fabricpilot twin, or a switch agent) "
             "instead of the in-process twin.")] = None,
    dataplane_token_file: Annotated[Path | None, typer.Option(
        help="File holding the bearer token of --dataplane.")] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
    single_process: Annotated[bool, typer.Option(
        "--single-process", metavar=_FLAG,
        help="Run the controller in the API's process (one core) instead of a control "
             "process of its own.")] = False,
) -> None:
    """Run the controller as a service: REST API, dashboard and Prometheus metrics."""
    import uvicorn

    from fabricpilot.collector import freeze_startup_objects, keep_freed_memory
    from fabricpilot.service.auth import TokenRegistry
    from fabricpilot.service.control import ServiceSpec
    from fabricpilot.service.server import (
        StateDirLock,
        build,
        build_process,
        configure_logging,
    )

    if time_scale is not None:
        _number(time_scale, "--time-scale", low=0, high=1e6)
        if not twin or dataplane is not None:
            _fail("--time-scale: paces the in-process twin, which "
                  + ("--no-twin" if not twin else "--dataplane") + " leaves out (a twin of "
                  "its own process takes the option: fabricpilot twin --time-scale)")
    else:
        time_scale = _TIME_SCALE
    if dataplane_token_file is not None and dataplane is None:
        _fail("--dataplane-token-file: the token of a --dataplane, which is not given")
    _number(tick_interval, "--tick-interval", low=0, high=86_400)
    if telemetry_interval is not None:
        _number(telemetry_interval, "--telemetry-interval", low=0, high=86_400)
        if twin and dataplane is None:
            _fail("--telemetry-interval: the twin reports every control period; the option "
                  "is for switches' telemetry (--no-twin, or --dataplane)")
    _number(plan_interval, "--plan-interval", low=0, high=86_400, low_ok=True)
    _number(port, "--port", low=1, high=65_535, low_ok=True)
    if log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        _fail(f"--log-level: unknown level {log_level!r}")
    max_body_bytes = _size(max_body, "--max-body")
    if max_body_bytes < 1:
        _fail(f"--max-body: must be at least 1 byte, got {max_body!r}")
    if max_body_bytes > _MAX_BODY_BYTES:
        _fail(f"--max-body: at most 1GiB, got {max_body!r}")
    listener = _listen(host, port)  # (before the state is read: a port in use fails first)
    # the control process dying under us: stop serving (a supervisor restarts serve, which
    # restores the state) rather than answer 503 forever
    lost: list[str] = []
    servers: list[uvicorn.Server] = []

    def on_lost(why: str) -> None:
        lost.append(why)
        for server in servers:
            server.should_exit = True

    # one service per state directory: held until serve ends (the kernel frees it on a crash)
    lock = StateDirLock(state_dir)
    try:
        sc, source = _load(scenario)
        lock.acquire()
        tokens = TokenRegistry.from_file(tokens_file) if tokens_file is not None else None
        dp_token = _read_token(dataplane_token_file, "--dataplane-token-file")
        with err.status("planning the declared jobs"):
            if single_process:
                keep_freed_memory()  # (this process plans: its memory kept between plans)
                api, service, _, token_file = build(
                    sc, source, state_dir, tokens=tokens, twin=twin, time_scale=time_scale,
                    tick_interval_s=tick_interval, plan_interval_s=plan_interval,
                    max_body_bytes=max_body_bytes, dataplane_url=dataplane,
                    dataplane_token=dp_token, telemetry_interval_s=telemetry_interval)
                restored, n_gpus = service.restored, service.n_gpus
            else:
                spec = ServiceSpec(sc, source, state_dir, twin=twin, time_scale=time_scale,
                                   tick_interval_s=tick_interval,
                                   telemetry_interval_s=telemetry_interval,
                                   plan_interval_s=plan_interval, dataplane_url=dataplane,
                                   dataplane_token=dp_token, log_level=log_level.upper(),
                                   twin_process=True)
                api, control, _, token_file = build_process(
                    spec, tokens=tokens, max_body_bytes=max_body_bytes, on_lost=on_lost)
                restored, n_gpus = control.restored, control.n_gpus
    except FabricpilotError as e:
        lock.release()
        listener.close()
        _fail(str(e))
    err.print(escape(f"fabricpilot controller on http://{host}:{port}  (dashboard /, API docs "
                     f"/docs, metrics /metrics); state in {state_dir}/"
                     + (f"; restored {_count(restored['jobs'], 'job')}, "
                        f"{_count(restored['path_sets'], 'path set')}, the fault state of "
                        f"{_count(restored['faults'], 'link')}"
                        if restored["jobs"] or restored["faults"]
                        else "")), highlight=False, soft_wrap=True)
    if token_file is not None:
        err.print(escape(f"operator token: {token_file}"), highlight=False, soft_wrap=True)
    if tokens is not None and tokens_file is not None:
        _warn(str(tokens_file), tokens.gpus_beyond(n_gpus))
    configure_logging(log_level.upper())
    freeze_startup_objects()
    servers.append(uvicorn.Server(uvicorn.Config(api, host=host, port=port,
                                                 log_level="warning", access_log=False)))
    try:
        servers[0].run(sockets=[listener])
    finally:
        lock.release()
    if lost:
        err.print("[bold red]error:[/] " + escape(f"{lost[0]}; serve stopped (start it again: "
                                                  f"the state in {state_dir}/ is restored)"),
                  highlight=False, soft_wrap=True)
        raise typer.Exit(1)


def _read_token(path: Path | None, flag: str) -> str | None:
    if path is None:
        return None
    from fabricpilot.textfiles import UnreadableFile, read_text_file

    try:
        token = read_text_file(path, max_bytes=1 << 16).strip()
    except UnreadableFile as e:
        _fail(f"{flag}: {path}: {e}")
    if len(token) < 16:
        _fail(f"{flag}: {path}: token too short (>= 16 characters)")
    return token


@app.command(help="Run the twin as a data plane of its own, for a controller to drive over "
             "HTTP.\n\nThe scenario's jobs train in scaled real time, and a controller "
             "(fabricpilot serve --dataplane URL) drives it over HTTP. Without a controller, "
             "or when it dies, it keeps forwarding on the rules it holds.")
def twin(
    scenario: Annotated[Path | None, typer.Argument(
        metavar="SCENARIO",
        help="Scenario to run; the built-in default scenario when omitted.")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8766,
    time_scale: Annotated[float, typer.Option(
        help="Fabric seconds per wall second (1e-3: 1 ms per second).")] = _TIME_SCALE,
    token_file: Annotated[Path | None, typer.Option(
        help="File holding the bearer token a controller must present.")] = None,
) -> None:
    """Run the twin as a data plane of its own (see the command's help)."""
    import uvicorn

    from fabricpilot.service.server import build_twin, configure_logging

    _number(time_scale, "--time-scale", low=0, high=1e6)
    _number(port, "--port", low=1, high=65_535, low_ok=True)
    token = _read_token(token_file, "--token-file")
    listener = _listen(host, port)
    try:
        sc, source = _load(scenario)
        api, runner, _ = build_twin(sc, source, time_scale=time_scale, token=token)
    except FabricpilotError as e:
        listener.close()
        _fail(str(e))
    err.print(escape(f"fabricpilot twin of {source} on http://{host}:{port}/southbound/v1"),
              highlight=False, soft_wrap=True)
    configure_logging("WARNING")
    runner.start()
    try:
        uvicorn.Server(uvicorn.Config(api, host=host, port=port, log_level="warning",
                                      access_log=False)).run(sockets=[listener])
    finally:
        runner.stop()


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` for the server to listen on (bound here, before
    anything starts or is printed: a port in use or a bad host is one line, exit 2)."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except (OSError, UnicodeError) as e:
        _fail(f"--host: cannot resolve {host!r}: {getattr(e, 'strerror', None) or e}")
        raise AssertionError from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        _fail(f"--host, --port: cannot listen on {host}:{port}: {e.strerror or e}")
    return sock


@app.command()
def validate(
    scenario: Annotated[Path, typer.Argument(metavar="SCENARIO", help="Scenario YAML to check.")],
) -> None:
    """Check a scenario file (schema, units, GPUs, topology) without running it."""
    from fabricpilot.runner import config_warnings, prepare

    try:
        sc, source = _load(scenario)
        prep = prepare(sc, source)
    except FabricpilotError as e:
        _fail(str(e))
        return
    _warn(source, config_warnings(sc, prep))
    n_gpus = sum(j.n_gpus for j in prep.jobs)
    out.print(escape(f"{scenario}: ok ({prep.topology.topo.summary()}; "
                     f"{_count(len(prep.jobs), 'job')} on {_count(n_gpus, 'GPU')}; policies "
                     f"{', '.join(sc.policies)})"), highlight=False, soft_wrap=True)


MAX_SIZE_BYTES = 1 << 50  # the largest message a sweep takes (1 PiB)


def _size(value: str, flag: str) -> int:
    try:
        size = parse_quantity(value, "size")
    except UnitError as e:
        _fail(f"{flag}: {e}")
        raise AssertionError from None
    if not math.isfinite(size) or size > MAX_SIZE_BYTES:
        _fail(f"{flag}: {value!r} is beyond the largest size taken (1 PiB)")
    if size != int(size):
        _fail(f"{flag}: expected a whole number of bytes, got {value!r}")
    return int(size)


def _number(value: float, flag: str, *, low: float, high: float, low_ok: bool = False
            ) -> None:
    """Fail with one line unless ``low < value <= high`` (``low <= value`` if ``low_ok``)."""
    above = value >= low if low_ok else value > low
    if not (math.isfinite(value) and above and value <= high):
        got = str(value) if isinstance(value, int) else f"{value:g}"  # (an int: its digits)
        _fail(f"{flag}: must be {'>=' if low_ok else '>'} {low:g} and <= {high:g}, got {got}")


@app.command("nccl-test")
def nccl_test(
    op: Annotated[str, typer.Option(help="allreduce, allgather, reducescatter, alltoall, "
                                          "broadcast")] = "allreduce",
    gpus: Annotated[int, typer.Option(help="GPUs (ranks); the cluster is sized to fit.")] = 16,
    min_bytes: Annotated[str, typer.Option(
        "--min-bytes", "-b", help="Smallest message, as nccl-tests' -b (1M is 2^20 bytes, "
                                  "1MB 10^6): per rank for AllReduce, AlltoAll and "
                                  "Broadcast, in all for AllGather and ReduceScatter."
    )] = "1M",
    max_bytes: Annotated[str, typer.Option("--max-bytes", "-e",
                                           help="Largest message (as --min-bytes).")] = "1G",
    step_factor: Annotated[int, typer.Option(
        "--step-factor", "-f", help="Each size this many times the previous one.")] = 2,
    policy: Annotated[str, typer.Option(
        "--policy", "-p", help="Load balancing: ecmp, adaptive, task-aware, ideal, ... "
                               "(fabricpilot policies lists them).")] = "ecmp",
    gpus_per_host: Annotated[int, typer.Option(help="GPUs per host (8 NICs, rails).")] = 8,
    rate_gbps: Annotated[float, typer.Option(help="NIC and fabric link rate.")] = 400.0,
    oversubscription: Annotated[float, typer.Option(help="Leaf down:up ratio.")] = 1.0,
    algorithm: Annotated[str, typer.Option(
        help="auto, ring, rails, hierarchical (for AlltoAll: PXN, shown as pxn), tree, "
             "flat")] = "auto",
    seed: Annotated[int, typer.Option(help="Seed of the run (hash seeds, placement).")] = 1,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", parser=_output_path,
        help="Also write sweep.csv and busbw.png (busbw and algbw against the "
             "message size) here.")] = None,
) -> None:
    """nccl-tests-style sweep of one collective over message sizes on a built-in cluster."""
    from fabricpilot.nccltests import (
        HEADER,
        algorithm_ranges,
        average_busbw,
        default_cluster,
        format_row,
        rounding_note,
        run_sweep,
        sweep_sizes,
    )
    from fabricpilot.scenario.models import Algorithm
    from fabricpilot.workload.collectives import supported_algorithms
    from fabricpilot.workload.plan import Op

    try:
        if op not in {o.value for o in Op}:
            _fail(f"--op: unknown op {op!r} (known: {', '.join(o.value for o in Op)})")
        if policy not in POLICIES:
            _fail(f"--policy: unknown policy {policy!r} (known: {', '.join(sorted(POLICIES))})")
        known = get_args(Algorithm)
        if algorithm not in known:
            _fail(f"--algorithm: unknown algorithm {algorithm!r} (known: {', '.join(known)})")
        usable = supported_algorithms(Op(op))
        if algorithm != "auto" and algorithm not in usable:
            _fail(f"--algorithm: {algorithm!r} is not available for {op} (use auto, "
                  f"{', '.join(usable)})")
        _number(gpus, "--gpus", low=2, high=MAX_GPUS, low_ok=True)
        _number(gpus_per_host, "--gpus-per-host", low=1, high=64, low_ok=True)
        _number(rate_gbps, "--rate-gbps", low=1e-3, high=1e6, low_ok=True)
        _number(oversubscription, "--oversubscription", low=1, high=64, low_ok=True)
        if seed < 0:
            _fail(f"--seed: must be >= 0, got {seed}")
        if out_dir is not None:
            _check_outputs(None, out_dir)
        sizes = sweep_sizes(_size(min_bytes, "--min-bytes"), _size(max_bytes, "--max-bytes"),
                            step_factor)
        ct = default_cluster(gpus, gpus_per_host, rate_gbps, oversubscription)
        if not (ct.switch_tier > 1).any() and (policy != "ecmp" or oversubscription > 1):
            # (the leaves take up to 64 hosts: up to that, a rail's hosts share one leaf)
            _warn("nccl-test", [f"the {gpus // gpus_per_host} hosts share one leaf per rail, "
                                "so no traffic crosses a spine: --policy and "
                                "--oversubscription change nothing (more than 64 hosts "
                                "have spines)"])
        _print(f"# fabricpilot nccl-test: {op}, {gpus} GPUs ({ct.topo.summary()}), "
              f"{rate_gbps:g} Gb/s, policy {policy}")
        _print("#")
        _print(HEADER)
        rows = run_sweep(ct, op, sizes, policy, algorithm=algorithm, seed=seed,
                         on_size=lambda r: _print(format_row(r), flush=True))
        _print(f"# Out of bounds values : 0 OK\n# Avg bus bandwidth    : {average_busbw(rows):g}")
        note = rounding_note(Op(op), sizes, gpus)
        if note is not None:
            _print(note)
        if rows:
            _print(f"# Algorithm            : {algorithm_ranges(rows)}")
        if out_dir is not None:
            title = f"{op}, {gpus} GPUs, {rate_gbps:g} Gb/s, policy {policy}\n{ct.topo.summary()}"
            try:
                _write_sweep(out_dir, rows, title, rate_gbps / 8.0)
            except OSError as e:
                _fail(f"--out: cannot write {e.filename or out_dir}: {e.strerror or e}")
            _print(f"# sweep written to {out_dir}/sweep.csv and {out_dir}/busbw.png")
    except (FabricpilotError, ValueError) as e:
        _fail(str(e))
    except OverflowError:
        _fail(_OVERFLOW)


def _write_sweep(out_dir: Path, rows: list[Any], title: str, nic_GBps: float) -> None:
    """``sweep.csv`` (one row per size, nccl-tests' columns) and ``busbw.png``."""
    from fabricpilot.nccltests import write_sweep_csv
    from fabricpilot.report.plots import plot_sweep

    out_dir.mkdir(parents=True, exist_ok=True)
    write_sweep_csv(rows, out_dir / "sweep.csv")
    plot_sweep([r.size_bytes for r in rows], [r.busbw_GBps for r in rows],
               [r.algbw_GBps for r in rows], title, out_dir / "busbw.png", nic_GBps)


@topology_app.command("show")
def topology_show(
    scenario: Annotated[Path | None, typer.Argument(metavar="SCENARIO",
                                                    help="Scenario YAML (default built-in).")]
    = None,
) -> None:
    """Summarise a scenario's topology: GPUs, switches, links and ECMP fan-out."""
    from fabricpilot.runner import build_scenario_topology
    from fabricpilot.topology import compile_topology

    try:
        sc, source = _load(scenario)
        ct = compile_topology(build_scenario_topology(sc, source))
    except FabricpilotError as e:
        _fail(str(e))
        return
    out.print(escape(ct.topo.summary()), highlight=False, soft_wrap=True)
    out.print(f"{ct.n_links} directed links; max ECMP group size {int(ct.nh_count.max())}",
              soft_wrap=True)


@topology_app.command("export")
def topology_export(
    path: Annotated[Path, typer.Argument(parser=_output_path, metavar="PATH",
                                         help="Output JSON file ('-': standard output).")],
    scenario: Annotated[Path | None, typer.Option(help="Scenario YAML (default built-in).")]
    = None,
) -> None:
    """Export a scenario's topology as JSON (re-importable with topology.kind: file)."""
    import json

    from fabricpilot.runner import build_scenario_topology
    from fabricpilot.topology.io import save_topology_json, topology_to_dict

    if str(path) == "-":  # (for a pipe: the JSON alone on stdout)
        try:
            sc, source = _load(scenario)
            text = json.dumps(topology_to_dict(build_scenario_topology(sc, source)), indent=1)
        except FabricpilotError as e:
            _fail(str(e))
            return
        _print(text, flush=True)
        return
    _check_outputs(path, None, "topology export")
    try:
        sc, source = _load(scenario)
        for inp in _inputs(scenario, sc):
            if _same_file(path, inp):
                _fail(f"topology export: {path} is the input {inp}: it would be overwritten")
        if path.is_file() and not _is_topology_file(path):
            _fail(f"topology export: {path} exists and is not a topology file (a scenario "
                  "goes in --scenario): it would be overwritten; remove it or give another "
                  "path")
        path.parent.mkdir(parents=True, exist_ok=True)
        save_topology_json(build_scenario_topology(sc, source), path)
    except FabricpilotError as e:
        _fail(str(e))
    except OSError as e:
        _fail(f"{path}: cannot write the topology: {e.strerror or e}")
    out.print(escape(f"topology written to {path}"), highlight=False, soft_wrap=True)


def _is_topology_file(path: Path) -> bool:
    """Whether ``path`` reads as a topology file (``topology export`` replaces one, not a
    scenario or anything else a mistyped argument names)."""
    from fabricpilot.topology.io import load_topology_json

    try:
        load_topology_json(path)
    except FabricpilotError:
        return False
    return True


@app.command()
def policies() -> None:
    """List the routing policies."""
    width = max(len(n) for n in POLICIES)
    for name in sorted(POLICIES):
        # the policy class's own summary (several policies share a module)
        factory = POLICIES[name]
        doc = (factory.__doc__ or sys.modules[factory.__module__].__doc__ or "").strip()
        first = " ".join(doc.split("\n\n")[0].split()).replace(" (see the module docstring)",
                                                                 "")
        out.print(f"{name:<{width}}  {first}", highlight=False, soft_wrap=True)


@app.callback(invoke_without_command=True)
def _main(
    version: Annotated[bool, typer.Option("--version", metavar=_FLAG,
                                          help="Show the version.")] = False,
) -> None:
    if version:
        out.print(f"fabricpilot {__version__}")
        raise typer.Exit()


def _command_named(args: list[str]) -> str:
    """The command the leading ``args`` name (``fabricpilot topology export``), for a usage
    error raised before the command's own context exists (an option missing its value).

    >>> _command_named(["topology", "export", "--scenario"])
    'fabricpilot topology export'
    >>> _command_named(["--bogus"])
    'fabricpilot'
    """
    words, group = ["fabricpilot"], typer.main.get_command(app)
    for arg in args:
        sub = getattr(group, "commands", {}).get(arg)
        if sub is None:
            break
        words.append(arg)
        group = sub
    return " ".join(words)


def main() -> None:
    """The ``fabricpilot`` command: a usage error (an unknown option, a value of the wrong
    type, a missing argument) is one line too, ``error: COMMAND: PROBLEM``, exit 2."""
    try:
        code = app(prog_name="fabricpilot", standalone_mode=False)
    except Exception as e:  # (the CLI library's own errors, known by their class names:
        # typer has them from click or from a copy of its own, by version)
        kinds = {c.__name__ for c in type(e).__mro__}
        ctx = getattr(e, "ctx", None)
        if "NoArgsIsHelpError" in kinds and ctx is not None:  # (no command at all: help)
            print(ctx.get_help())
            sys.exit(EXIT_INPUT)
        if "ClickException" not in kinds:
            raise  # (a bug: its traceback)
        problem = " ".join(e.format_message().split())  # type: ignore[attr-defined]
        if "UsageError" in kinds:
            where = ctx.command_path if ctx is not None else _command_named(sys.argv[1:])
            problem = f"{where}: {problem} (see {where} --help)"
        err.print(f"[bold red]error:[/] {escape(problem)}", highlight=False, soft_wrap=True)
        sys.exit(EXIT_INPUT)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
