"""JSON built from constrained gens: the fixed keys are plain text, each value is a gen
limited by a regex or dtype, and `var_scope` captures the whole object as one variable.

    python examples/json_decode.py [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

import json
from typing import Any

from _util import CacheMeter, backend_from_args

import radixlm as rl


@rl.function
def city_card(s, city):
    s += rl.system("You write short factual JSON records.")
    s += rl.user(f"Describe {city} as a JSON object.")
    s += rl.assistant_begin()
    with s.var_scope("json"):
        s += "{\n"
        s += f'  "name": "{city}",\n'
        country = rl.gen("country", regex=r'"[A-Z][a-zA-Z ]{1,24}"', max_tokens=12)
        s += '  "country": ' + country + ",\n"
        s += '  "population_millions": ' + rl.gen_int("population", max_tokens=4) + ",\n"
        s += '  "is_capital": ' + rl.gen("capital", regex=r"(true|false)", max_tokens=3) + "\n"
        s += "}"
    s += rl.assistant_end()


def main(backend: Any) -> dict[str, Any]:
    meter = CacheMeter(backend)
    states = city_card.run_batch(
        [{"city": c} for c in ("Paris", "Tokyo")], backend=backend, temperature=0
    )
    records = [json.loads(s["json"]) for s in states]
    for record in records:
        print(json.dumps(record))
    return {"records": records, "cache": meter.report()}


if __name__ == "__main__":
    main(backend_from_args(__doc__))
