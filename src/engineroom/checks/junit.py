"""JUnit XML for CI systems: one testsuite per verify run, one testcase per check.

FAIL -> ``<failure message=reason>``, SKIP -> ``<skipped message=reason>``; a check run K times
(``--repeat``) says pass k/K in its system-out, a soak its WARN / INCONCLUSIVE verdict, the
toolstream probe its PASS / DROP counts. Times are the client clock's.
"""

from __future__ import annotations

from collections.abc import Sequence
from xml.etree import ElementTree as ET

from engineroom.checks.smoke import CheckResult


def junit_xml(results: Sequence[CheckResult], *, suite: str, engine: str = "", model: str = "",
              run_id: int | None = None) -> str:
    """The run's results as a JUnit XML document (a string, UTF-8 declared)."""
    failures = sum(1 for r in results if r.status == "FAIL")
    skipped = sum(1 for r in results if r.status == "SKIP")
    root = ET.Element("testsuites", name="engineroom verify", tests=str(len(results)), failures=str(failures),
                      errors="0", skipped=str(skipped), time=f"{sum(r.seconds for r in results):.3f}")
    ts = ET.SubElement(root, "testsuite", name=f"verify.{suite}", tests=str(len(results)), failures=str(failures),
                       errors="0", skipped=str(skipped), time=f"{sum(r.seconds for r in results):.3f}")
    props = ET.SubElement(ts, "properties")
    for key, value in (("engine", engine), ("model", model), ("run_id", "" if run_id is None else str(run_id))):
        if value:
            ET.SubElement(props, "property", name=key, value=value)
    for r in results:
        case = ET.SubElement(ts, "testcase", classname=f"verify.{suite}", name=r.name, time=f"{r.seconds:.3f}")
        if r.status == "FAIL":
            ET.SubElement(case, "failure", message=r.reason, type="CheckFailed").text = r.reason
        elif r.status == "SKIP":
            ET.SubElement(case, "skipped", message=r.reason)
        notes = []
        if r.details.get("repeat", 1) > 1:
            notes.append(f"passed {r.details.get('passes', 0)}/{r.details.get('ran', 0)} of {r.details['repeat']} runs")
        if r.details.get("forced"):
            notes.append(f"format forced: {r.details['forced']}")
        if r.details.get("verdict") in ("WARN", "INCONCLUSIVE"):   # a soak: WARN passes, INCONCLUSIVE fails
            notes.append(f"soak verdict {r.details['verdict']}: {r.reason}")
        if r.details.get("suite") == "toolstream" and r.details.get("tries"):
            notes.append(f"{r.details.get('pass', 0)} PASS, {r.details.get('drop', 0)} DROP of "
                         f"{r.details['tries']} streamed tool calls")
        if notes:
            ET.SubElement(case, "system-out").text = "\n".join(notes)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
