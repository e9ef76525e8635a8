"""queueing"""
