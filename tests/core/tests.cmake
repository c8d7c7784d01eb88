# core: its pure tests (launch environment, machine facts) are in core/pure/, built into unit_pure_tests.
