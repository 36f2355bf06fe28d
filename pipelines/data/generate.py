"""Regenerates the sample exports shipped with the example pipelines.

Deterministic: the same files every time. Run from this folder:
    python3 generate.py
"""
import json
import random
from datetime import date, timedelta

rng = random.Random(20240101)
customers = ["acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "wonka"]
statuses = ["new", "paid", "shipped", "cancelled"]

day = date(2024, 1, 1)
while day < date(2024, 2, 1):
    folder = f"orders/{day:%Y/%m/%d}"
    import os
    os.makedirs(folder, exist_ok=True)
    with open(f"{folder}/orders.csv", "w") as f:
        f.write("order_id,customer,total,currency,status,created,note\n")
        for n in range(1, 21):
            total = f"{rng.randint(100, 99999) / 100:.2f}"
            created = f"{day:%d.%m.%Y} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
            note = rng.choice(["", "gift wrap", "express", "call before delivery", "leave at door"])
            currency = rng.choice(["EUR", "EUR", "EUR", "USD", ""])
            f.write(f"O-{day:%Y%m%d}-{n:03d},{rng.choice(customers)},{total},{currency},{rng.choice(statuses)},{created},{note}\n")
    day += timedelta(days=1)

day = date(2024, 1, 1)
os.makedirs("events", exist_ok=True)
while day < date(2024, 1, 8):
    with open(f"events/{day:%Y-%m-%d}.ndjson", "w") as f:
        for n in range(1, 11):
            event = {
                "id": f"E-{day:%Y%m%d}-{n:02d}",
                "at": f"{day:%Y-%m-%d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z",
                "user": {"id": rng.randint(1, 50), "plan": rng.choice(["free", "pro"])},
                "kind": rng.choice(["login", "upgrade", "export"]),
                "payload": {"ms": rng.randint(5, 900)},
            }
            f.write(json.dumps(event) + "\n")
    day += timedelta(days=1)
