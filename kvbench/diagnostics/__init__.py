"""Each press on its own: what it costs when it runs for real (`speed`, `kvbench speed`) and whether it does
what it claims (`conformance`, `kvbench check-press`). Above the harness: both plan configs with its
planning."""
