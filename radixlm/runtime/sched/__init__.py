"""The scheduler and the state it alone changes: requests, admission under KV and token
budgets, retraction, the KV ledger, stop conditions, and the plain decode strategy."""
