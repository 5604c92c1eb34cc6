"""Exactly-once effects: the consume loop, a fetched item and its decoding, the batch
transaction with its inbox, provenance (a fact bound to its gateway), the outcomes and
their settling, the transactional outbox and its relay, and what a worker is (`Worker`).

The only room that knows facts and workers' handlers; it uses `bus`, `store`,
`observability` and `base`. Answers "where is exactly-once?".
"""
