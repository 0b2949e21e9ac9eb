"""placeholder"""
from policy_review import Site

REVIEWED: list[Site] = []
