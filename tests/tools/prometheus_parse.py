#!/usr/bin/env python3
"""tests/tools/prometheus_parse.py URL: fetches a daemon's /metrics and parses it with the
prometheus_client text parser (Debian python3-prometheus-client); prints every family as JSON,
{name: {"type": T, "help": H, "samples": [[sample name, {label: value}, value], ...]}}.
Exit 77 (the test skips, with this message) when prometheus_client is not installed; 1 when
the text does not parse."""
import json
import sys
import urllib.request

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:
    print(f"python3 has no prometheus_client ({e}); Debian: apt-get install python3-prometheus-client")
    sys.exit(77)

text = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode("utf-8")
families = {}
try:
    for f in text_string_to_metric_families(text):
        if f.name in families:
            raise ValueError(f"family {f.name} appears twice")
        families[f.name] = {"type": f.type, "help": f.documentation,
                            "samples": [[s.name, s.labels, s.value] for s in f.samples]}
except ValueError as e:
    print(f"/metrics does not parse: {e}")
    sys.exit(1)
json.dump(families, sys.stdout)
