"""Operations tooling: ``fleet`` the command (``cli``), the supervisor of ``fleet up``
(``supervisor``), and the embedded default's local PostgreSQL and Redis (``local``).
"""
