"""Example project: functions a host runs inside a sandbox."""
