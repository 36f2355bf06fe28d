"""Checks OpenLineage run events against openlineage-python, the project's
reference client (issue 23): each event (one JSON object per line on stdin)
is rebuilt from the client's generated classes, whose validators check the
formats (event time, run id, nominal times, URIs), and the client's own
serialisation of it must equal the event as sent, key for key: a misnamed
field, a facet under the wrong schema URL or a wrong type fails.

Exit 0 when every event passes; else each failure on stderr and exit 1.
"""

import json
import sys

from openlineage.client.generated import base
from openlineage.client.generated.nominal_time_run import NominalTimeRunFacet
from openlineage.client.generated.output_statistics_output_dataset import (
    OutputStatisticsOutputDatasetFacet,
)
from openlineage.client.serde import Serde


def rebuild(event):
    base.set_producer(event["producer"])
    nominal = event["run"]["facets"]["nominalTime"]
    outputs = []
    for out in event.get("outputs", []):
        facets = None
        stats = out.get("outputFacets", {}).get("outputStatistics")
        if stats is not None:
            # attrs keeps whatever it is given: the schema says integer.
            if not isinstance(stats["rowCount"], int) or isinstance(stats["rowCount"], bool):
                raise TypeError(f"rowCount is not an integer: {stats['rowCount']!r}")
            facets = {"outputStatistics": OutputStatisticsOutputDatasetFacet(rowCount=stats["rowCount"])}
        outputs.append(base.OutputDataset(namespace=out["namespace"], name=out["name"], outputFacets=facets))
    return base.RunEvent(
        eventType=base.EventType[event["eventType"]],
        eventTime=event["eventTime"],
        run=base.Run(
            runId=event["run"]["runId"],
            facets={
                "nominalTime": NominalTimeRunFacet(
                    nominalStartTime=nominal["nominalStartTime"],
                    nominalEndTime=nominal.get("nominalEndTime"),
                )
            },
        ),
        job=base.Job(namespace=event["job"]["namespace"], name=event["job"]["name"]),
        inputs=[base.InputDataset(namespace=i["namespace"], name=i["name"]) for i in event.get("inputs", [])],
        outputs=outputs,
        producer=event["producer"],
    )


def without_empty(value):
    """The client's form without the empty optional containers it adds
    (a dataset's `facets: {}`), which the spec does not require."""
    if isinstance(value, dict):
        return {k: without_empty(v) for k, v in value.items() if v != {} and v != []}
    if isinstance(value, list):
        return [without_empty(v) for v in value]
    return value


def main():
    failures = 0
    checked = 0
    for n, line in enumerate(sys.stdin, 1):
        if not line.strip():
            continue
        checked += 1
        event = json.loads(line)
        try:
            rebuilt = without_empty(Serde.to_dict(rebuild(event)))
        except Exception as e:  # a validator or a missing key
            print(f"event {n}: {type(e).__name__}: {e}", file=sys.stderr)
            failures += 1
            continue
        if rebuilt != event:
            print(f"event {n} differs from the client's form:\n  sent:  {json.dumps(event, sort_keys=True)}\n  client: {json.dumps(rebuilt, sort_keys=True)}", file=sys.stderr)
            failures += 1
    print(f"{checked} event(s) checked, {failures} failure(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
