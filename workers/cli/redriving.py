"""`bcw dead-letters list|redrive`: the dead letters with their reasons, a page at a time,
and re-sending the chosen ones to their subjects after the same checks a relay makes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from workers.cli.common import EXIT_BAD_SETTINGS, EXIT_FAILED, Commands, plain
from workers.settings import Settings


def add(commands: Commands) -> None:
    """Register this group's commands."""
    dead = commands.add_parser("dead-letters", help="list or re-drive dead-lettered messages")
    dead_commands = dead.add_subparsers(dest="action", required=True, metavar="ACTION")
    which = argparse.ArgumentParser(add_help=False)  # what both actions choose letters by
    which.add_argument("--worker", help="only this worker's dead letters")
    which.add_argument(
        "--cause",
        help="only dead letters of this cause (invalid, handler, max-deliveries, unsupported-major)",
    )
    key: dict[str, Any] = {"type": _letter_key, "metavar": "STREAM:SEQ"}
    which.add_argument("--seq", action="append", help="only this letter (repeatable)", **key)
    which.add_argument("--limit", type=int, default=1000, help="at most this many (a page)")
    which.add_argument("--after", help="from the dead letter after this one (paging)", **key)
    listed = dead_commands.add_parser(
        "list", parents=[which], help="the dead letters with their reasons, a page at a time"
    )
    listed.add_argument("--json", action="store_true", help="one JSON object per letter")
    listed.set_defaults(handler=_cmd_dead_letters, all=False, dry_run=False, yes=False)
    redrive = dead_commands.add_parser(
        "redrive", parents=[which], help="re-send the chosen dead letters to their subjects"
    )
    redrive.add_argument("--all", action="store_true", help="every dead letter, knowingly")
    redrive.add_argument(
        "--dry-run", action="store_true", help="say what would be re-driven, do nothing"
    )
    redrive.add_argument("--yes", action="store_true", help="ask no confirmation")
    redrive.set_defaults(handler=_cmd_dead_letters, json=False)


def _letter_key(text: str) -> tuple[str, int]:
    from workers.runtime.bus import deadletter

    try:
        return deadletter.parse_key(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _cmd_dead_letters(args: argparse.Namespace, settings: Settings) -> int:
    from schemas.subjects import Subjects
    from workers import registry  # noqa: F401  (hands the runtime what each worker publishes)
    from workers.runtime.bus import connection, deadletter
    from workers.runtime.bus import letters as checks
    from workers.tools.display import printable

    chosen = args.worker or args.cause or args.seq
    if args.action == "redrive" and not chosen and not args.all:
        print(
            "bcw dead-letters redrive: say which: --worker, --cause, --seq, or --all",
            file=sys.stderr,
        )
        return EXIT_BAD_SETTINGS  # before any connection: nothing was touched

    async def run() -> int:
        subjects = Subjects(settings.subject_root)
        nc = await connection.connect(settings.nats, name="bcw dead-letters")
        try:
            js = nc.jetstream()
            missing: list[str] = []
            if args.seq:  # looked up directly, wherever they are in their streams
                letters, missing = await deadletter.dead_letters_at(js, subjects, args.seq)
                letters = [
                    x
                    for x in letters
                    if (not args.worker or x.worker == args.worker)
                    and (not args.cause or x.cause == args.cause)
                ]
            else:
                letters = await deadletter.list_dead_letters(
                    js, subjects, args.worker, args.limit, args.cause, args.after
                )
            for key in missing:
                print(f"no dead letter at {key}", file=sys.stderr)
            # each letter checked once: the verdict listed is the one a redrive acts on,
            # and a fact's body is read from its stream once
            checked = {letter.key: await checks.checked(js, subjects, letter) for letter in letters}
            verdicts = {seq: why for seq, (why, _body) in checked.items()}
            if args.action == "list" and args.json:
                for letter in letters:
                    print(
                        json.dumps(
                            {
                                "stream": letter.stream,
                                "seq": letter.seq,
                                "time": plain(letter.time),
                                "worker": letter.worker,
                                "cause": letter.cause,
                                "subject": letter.subject,
                                "stream_seq": letter.stream_seq,
                                "reason": letter.reason,
                                "refused": verdicts[letter.key],
                            }
                        )
                    )
                return EXIT_FAILED if missing else 0
            if args.action == "list":
                for letter in letters:
                    when = letter.time.isoformat(timespec="seconds") if letter.time else "-"
                    print(
                        printable(
                            f"{letter.key} {when} {letter.worker:<12} {letter.cause:<17} "
                            f"{letter.subject}  {letter.reason}"
                        )
                    )
                    if verdicts[letter.key] is not None:
                        print(printable(f"{'':>8} REFUSED for redrive: {verdicts[letter.key]}"))
                print(f"{len(letters)} dead letter(s)")
                if refused := sum(1 for why in verdicts.values() if why is not None):
                    print(f"{refused} refused for redrive (their source could not send them)")
                if not args.seq and len(letters) == args.limit:
                    print(f"more may follow: --after {letters[-1].key}")
                return EXIT_FAILED if missing else 0
            if args.dry_run:
                for letter in letters:
                    why = verdicts[letter.key]
                    print(
                        f"would re-drive {letter.key} to {letter.subject}"
                        if why is None
                        else printable(f"would refuse {letter.key}: {why}")
                    )
                good = sum(1 for why in verdicts.values() if why is None)
                print(f"{good} would be re-driven (--dry-run: nothing was)")
                return 0
            if letters and sys.stdin.isatty() and not args.yes:
                question = f"re-drive {len(letters)} dead letter(s)? [y/N] "
                answer = await asyncio.to_thread(input, question)
                if answer.strip().lower() not in ("y", "yes"):
                    print("nothing re-driven")
                    return 0
            refused = 0
            for letter in letters:
                why, body = checked[letter.key]
                if why is not None or body is None:
                    print(
                        printable(f"not re-driven: dead letter {letter.key}: {why}"),
                        file=sys.stderr,
                    )
                    refused += 1
                    continue
                await deadletter.resend(js, subjects, letter, body)
                print(f"re-drove {letter.key} to {letter.subject}")
            print(f"{len(letters) - refused} re-driven")
            return EXIT_FAILED if refused or missing else 0
        finally:
            await nc.close()

    return asyncio.run(run())
