"""polling"""
