"""The only place with SQL text: one module per table family, one owner per table.

Modules here hold SQL strings (parameterized; identifiers go through ``psycopg.sql``) and
nothing that runs them. The ops that run them live with the concept they serve.
"""
