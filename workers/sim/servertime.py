"""The fake daemon's server time: the seed's mark, its clock offset, and the freshness the
server gives its Hello's proof.

The seed's daemon is built around a clock that may be wrong. It keeps a **mark**, the
latest server time a Welcome or a heartbeat's answer told it, never moved back (a lost
journal keeps it), and a **clock offset**: server time minus its own clock when it was
last told one. Its working clock in server time is the latest of the mark, its own clock
through the offset, and what that clock said before: it never moves back. A server time
more than 5 minutes before the mark is not believed — a Welcome's ends that session, a
refusal's is not signed — and the next attempt goes to another gateway if it can.

**Proof freshness** (docs/contract.md, "The Hello's proof"): a Hello's proof signs the
daemon's own clock, or the last time it signed + 1 if that is later (its `at` rises). When
the Hello is refused `UNAUTHENTICATED`, the refusal carries the database's time and a
**challenge** the database issued for this node, that gateway and that time (a nonce
`srv-…`, dead once another proven Hello of the node is accepted); the daemon keeps the
offset from it, and signs its next Hello to that gateway with the challenge and its time,
once — whatever made its plain proof fail: a clock off, or one gone back past the newest
proof the control plane took (a proof not after that is refused, so that a gateway cannot
keep proofs back). It never signs a time a gateway told it with a nonce of its own: a
gateway cannot make up a challenge (the database's key MACs it), so it cannot get a proof
for a time the database did not say — only for now.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.proof import CHALLENGE_RE

#: a server time further behind the daemon's mark than this is not believed (the seed's
#: 5 minutes: a Welcome's ends that session)
MAX_CLOCK_BACK = 300.0
#: a challenge is used within this many seconds of the daemon's own clock after it was
#: told (the database takes its proof for 5 minutes after it issued it)
CHALLENGE_FOR = 240.0


@dataclass(frozen=True)
class Challenge:
    """The freshness a gateway's refusal gave: sign the next Hello to `gateway_id` with
    `nonce` at `at` (the database's time, Unix seconds)."""

    gateway_id: str
    at: int
    nonce: str
    told_at: float  # the daemon's own clock when it was told


@dataclass
class ServerTime:
    #: the latest server time a Welcome or a heartbeat's answer told it; never back
    mark: float = 0.0
    #: server time minus its own clock, when it was last told a server time it believed
    offset: float = 0.0
    challenge: Challenge | None = None
    #: the last `at` it signed (in memory): each proof's `at` is later than the one before
    signed: int = -1
    _latest: float = float("-inf")  # its working clock in server time: never back

    def now(self, own: float) -> float:
        """Its working clock in server time: the latest of the mark, its own clock through
        the offset, and what this clock said before."""
        self._latest = max(self._latest, self.mark, own + self.offset)
        return self._latest

    def believed(self, server_time: float) -> bool:
        """Whether a server time is believed: not more than 5 minutes before the mark."""
        return server_time >= self.mark - MAX_CLOCK_BACK

    def told(self, server_time: float, own: float, mark: bool = True) -> bool:
        """A server time a Welcome or a heartbeat's answer (`mark`), or a refusal, told it
        at its own clock `own`: believed, the offset follows it (and the mark moves forward
        with a Welcome's or a heartbeat's). Whether it was believed."""
        if not self.believed(server_time):
            return False
        self.offset = server_time - own
        if mark:
            self.mark = max(self.mark, server_time)
        return True

    def refused(
        self, gateway_id: str, server_time: float | None, challenge: str | None, own: float
    ) -> bool:
        """A refusal's server time and challenge: the offset follows a believed time, and a
        challenge of the server's form is kept for the next Hello to that gateway. Whether
        the refusal's time (if any) was believed."""
        if server_time is None:
            return True
        if not self.told(server_time, own, mark=False):
            return False
        if challenge is not None and CHALLENGE_RE.fullmatch(challenge):
            self.challenge = Challenge(gateway_id, int(server_time), challenge, own)
        return True

    def sign_at(self, clock: float) -> int:
        """The `at` of its next plain proof: its clock, or the last `at` it signed + 1 if
        that is later — a plain proof holds only after the newest the control plane took,
        so two Hellos in one second sign two seconds (its `at` runs ahead of its clock by
        the Hellos beyond one a second; past 5 minutes ahead they are refused, and it
        signs the refusal's challenge). A challenge's time never moves it: a gateway may hand
        any `srv-…` nonce with any time, and only the database can tell it is not its own."""
        self.signed = max(int(clock), self.signed + 1)
        return self.signed

    def take_challenge(self, gateway_id: str, own: float) -> Challenge | None:
        """The challenge to sign a Hello to `gateway_id` with, if one is held for it and
        fresh; it is used once."""
        held, self.challenge = self.challenge, None
        if held is None or held.gateway_id != gateway_id or own - held.told_at > CHALLENGE_FOR:
            return None
        return held

    def challenged_by(self) -> str | None:
        """The gateway whose challenge is held (the next Hello goes there if it can)."""
        return self.challenge.gateway_id if self.challenge is not None else None
